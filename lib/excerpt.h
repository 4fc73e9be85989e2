/* excerpt: the bounded stdout/stderr a task result carries. The whole logs
 * live in S3 (stdout.log, stderr.log); a result keeps the first and the last
 * EXCERPT_BYTES of each stream (docs/api.md, "Task result"). */
#ifndef KILN_EXCERPT_H
#define KILN_EXCERPT_H

#include <stddef.h>

#include <jansson.h>

#define EXCERPT_BYTES 4096 /* head, and tail, of each stream in a task result */

/* Bound result's "stdout"/"stderr" (and their "_tail") to keep bytes each,
 * cut on UTF-8 character boundaries: a longer stream keeps its first keep
 * bytes as NAME and its last keep bytes as NAME_tail, NAME_truncated becomes
 * true and NAME_bytes is set (to the length seen) when absent. For results
 * from elsewhere (an older record, a host): a result run_task built with
 * log_excerpt = keep is left as it is. Returns how many streams were cut. */
int excerpt_result(json_t *result, size_t keep);

#endif
