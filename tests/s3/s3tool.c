/* s3tool: a command-line driver over lib/s3.c, for the integration tests and
 * for measuring uploads against a real S3 server. Not a user tool.
 *
 *   s3tool [options] put KEY FILE            upload (multipart above the threshold)
 *   s3tool [options] put-multipart KEY FILE  upload as multipart whatever the size
 *   s3tool [options] get KEY FILE            download to FILE (temp name + rename)
 *   s3tool [options] head KEY                prints "size=N"; exit 3 if absent
 *   s3tool [options] delete KEY
 *   s3tool [options] presign KEY SECONDS [NOW]  prints a presigned GET URL
 *   s3tool [options] ensure-bucket
 *
 * Options (each defaults to the environment variable named):
 *   --endpoint URL (S3_ENDPOINT)  --region R (S3_REGION, else us-east-1)
 *   --bucket B (S3_BUCKET)        --access-key K (S3_ACCESS_KEY)
 *   --secret-key S (S3_SECRET_KEY)
 *   --attempts N  --timeout SECONDS  --part-size BYTES  --threshold BYTES
 *
 * put/put-multipart print "sha256=HEX bytes_sent=N seconds=S mib_per_s=R".
 * Errors go to stderr as "s3tool: CODE: MESSAGE", exit status 1 (2: usage). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "s3.h"

static void usage(void)
{
	fprintf(stderr, "usage: s3tool [--endpoint URL] [--region R] [--bucket B] [--access-key K] [--secret-key S]\n"
			"              [--attempts N] [--timeout S] [--part-size BYTES] [--threshold BYTES]\n"
			"              put|put-multipart KEY FILE | get KEY FILE | head KEY | delete KEY |\n"
			"              presign KEY SECONDS [NOW] | ensure-bucket\n");
	exit(2);
}

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);

	return v && v[0] ? v : dflt;
}

static unsigned long long number(const char *s, const char *what)
{
	char *end;
	unsigned long long v;

	v = strtoull(s, &end, 10);
	if (!s[0] || *end) {
		fprintf(stderr, "s3tool: %s: not a number: %s\n", what, s);
		exit(2);
	}
	return v;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int fail(const struct kiln_err *err)
{
	fprintf(stderr, "s3tool: %s: %s\n", err->code, err->message);
	return 1;
}

static int cmd_put(struct s3_config *c, char **argv, int force_multipart)
{
	struct kiln_err err = { .code = "" };
	char sha[65];
	uint64_t sent = 0;
	struct stat st;
	double t0, dt;

	if (force_multipart)
		c->multipart_threshold = 1;
	t0 = now_s();
	if (s3_put_file(c, argv[0], argv[1], "application/octet-stream", sha, &sent, &err) < 0)
		return fail(&err);
	dt = now_s() - t0;
	if (stat(argv[1], &st) < 0)
		st.st_size = 0;
	printf("sha256=%s bytes_sent=%llu seconds=%.3f mib_per_s=%.1f\n", sha, (unsigned long long)sent, dt,
	       dt > 0 ? (double)st.st_size / (1 << 20) / dt : 0.0);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "endpoint", required_argument, 0, 'e' },   { "region", required_argument, 0, 'r' },
		{ "bucket", required_argument, 0, 'b' },     { "access-key", required_argument, 0, 'a' },
		{ "secret-key", required_argument, 0, 's' }, { "attempts", required_argument, 0, 'n' },
		{ "timeout", required_argument, 0, 't' },    { "part-size", required_argument, 0, 'p' },
		{ "threshold", required_argument, 0, 'm' },  { 0, 0, 0, 0 },
	};
	struct s3_config c = {
		.endpoint = env_or("S3_ENDPOINT", NULL),
		.region = env_or("S3_REGION", "us-east-1"),
		.bucket = env_or("S3_BUCKET", NULL),
		.access_key = env_or("S3_ACCESS_KEY", NULL),
		.secret_key = getenv("S3_SECRET_KEY"),
	};
	struct kiln_err err = { .code = "" };
	const char *cmd;
	int o, n;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'e': c.endpoint = optarg; break;
		case 'r': c.region = optarg; break;
		case 'b': c.bucket = optarg; break;
		case 'a': c.access_key = optarg; break;
		case 's': c.secret_key = optarg; break;
		case 'n': c.attempts = (int)number(optarg, "--attempts"); break;
		case 't': c.timeout_s = (long)number(optarg, "--timeout"); break;
		case 'p': c.part_size = number(optarg, "--part-size"); break;
		case 'm': c.multipart_threshold = number(optarg, "--threshold"); break;
		default: usage();
		}
	}
	if (optind >= argc)
		usage();
	cmd = argv[optind];
	argv += optind + 1;
	n = argc - optind - 1;
	if (!c.endpoint || !c.bucket || !c.access_key || !c.secret_key) {
		fprintf(stderr, "s3tool: set --endpoint, --bucket, --access-key and --secret-key "
				"(or S3_ENDPOINT, S3_BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY)\n");
		return 2;
	}
	if (s3_global_init() < 0) {
		fprintf(stderr, "s3tool: curl_global_init failed\n");
		return 1;
	}

	if ((strcmp(cmd, "put") == 0 || strcmp(cmd, "put-multipart") == 0) && n == 2)
		return cmd_put(&c, argv, cmd[3] == '-');
	if (strcmp(cmd, "get") == 0 && n == 2)
		return s3_get_file(&c, argv[0], argv[1], &err) < 0 ? fail(&err) : 0;
	if (strcmp(cmd, "delete") == 0 && n == 1)
		return s3_delete(&c, argv[0], &err) < 0 ? fail(&err) : 0;
	if (strcmp(cmd, "ensure-bucket") == 0 && n == 0)
		return s3_ensure_bucket(&c, &err) < 0 ? fail(&err) : 0;
	if (strcmp(cmd, "head") == 0 && n == 1) {
		uint64_t size = 0;
		int rc = s3_head(&c, argv[0], &size, &err);

		if (rc < 0)
			return fail(&err);
		if (rc == 0) {
			fprintf(stderr, "s3tool: %s: no such key\n", argv[0]);
			return 3;
		}
		printf("size=%llu\n", (unsigned long long)size);
		return 0;
	}
	if (strcmp(cmd, "presign") == 0 && (n == 2 || n == 3)) {
		time_t now = n == 3 ? (time_t)number(argv[2], "NOW") : time(NULL);
		char *url = s3_presign_get(&c, argv[0], (unsigned)number(argv[1], "SECONDS"), now, &err);

		if (!url)
			return fail(&err);
		printf("%s\n", url);
		free(url);
		return 0;
	}
	usage();
	return 2;
}
