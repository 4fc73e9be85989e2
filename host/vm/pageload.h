/* pageload: a resume's page loader. It writes a paused session's changed
 * pages into the VM's RAM in QEMU's address space (process_vm_writev)
 * instead of through QEMU's own load, from two threads: the caller's (the
 * stream filter's) and a helper of its own. Writing is most of a resume's
 * CPU here (the kernel faults each page in copy-on-write, ~2 us apiece),
 * while the chunks are fetched and unpacked ahead of it; one thread left
 * the machine's second core idle for ~40 ms of a ~100 ms resume. */
#ifndef KILN_PAGELOAD_H
#define KILN_PAGELOAD_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"

/* Pages per batch: one process_vm_writev (IOV_MAX iovecs on each side). */
#define PAGELOAD_BATCH 1024

struct pageload;

/* A loader for a RAM block of size bytes, its helper thread started. It
 * writes nothing until pageload_target says where the block is. NULL with
 * err set (out of memory, no thread). */
struct pageload *pageload_new(uint64_t size, struct kiln_err *err);

/* Where the block is: QEMU's pid and the block's address in it; pid 0 when
 * the VM will never come (a loader waiting for it gives up: -1). The first
 * call counts. Any thread. */
void pageload_target(struct pageload *pl, pid_t pid, uintptr_t ram);

/* A page to write at offset addr of the block (addr < size, a multiple of
 * 4096; 4096 bytes at data). data must stay valid until pageload_flush
 * returns. Blocks until the target is known once a batch is full. 0, or -1
 * when a write failed or the VM will not come (then every later call is -1
 * too). ctx is the loader: the filter's page callback (migfilter_base). One
 * thread calls page and flush. */
int pageload_page(void *ctx, uint64_t addr, const uint8_t *data);

/* Every page handed over so far is written when this returns 0 (both
 * threads' batches): the caller may then reuse the pages' memory. -1 as
 * for pageload_page. */
int pageload_flush(void *ctx);

/* Pages written so far, and the batches of them the helper wrote
 * (diagnostics, tests). */
void pageload_stats(struct pageload *pl, uint64_t *pages, uint64_t *helped);

/* Stop the helper and free the loader (NULL: nothing). Pages handed over
 * but not flushed may or may not have been written. */
void pageload_free(struct pageload *pl);

#endif
