/* fuzz_config: libFuzzer target for kiln-host's configuration file parser
 * (config_load), fed through a memfd path. Checks that a refusal names the
 * problem and that an accepted file's values are within their documented
 * ranges. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host_config.h"
#include "net.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int fd = -1;
	char path[64];
	struct host_config c;
	struct kiln_err err = { .code = "" };

	if (fd < 0)
		fd = memfd_create("fuzz-config", MFD_CLOEXEC);
	check(fd >= 0);
	check(ftruncate(fd, 0) == 0 && pwrite(fd, data, size, 0) == (ssize_t)size);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (config_load(path, &c, &err) < 0) {
		check(err.errc == KERR_CONFIG && err.message[0]);
		return 0;
	}
	check(c.pool_size >= -1 && c.pool_size <= 256 && c.prestart >= -1 && c.prestart <= 256);
	check(c.vcpus <= 4096 && (c.cpu_overcommit == 0 || (c.cpu_overcommit >= 1 && c.cpu_overcommit <= 64)));
	check(!c.s3.endpoint || (c.s3.bucket && (!strncmp(c.s3.endpoint, "http://", 7) ||
						  !strncmp(c.s3.endpoint, "https://", 8))));
	check(c.root != NULL);
	if (c.network) {
		/* Accepted by config_load: the network section checks out again,
		 * and what it yields is within its documented bounds. */
		struct net_host h;

		check(net_config_check(c.network, &h, &err) == 0);
		check(h.ndeny >= 11 && h.ndeny <= NET_MAX_RANGES && h.link.prefix >= 8 && h.link.prefix <= 24);
		for (size_t i = 0; i < h.ndeny; i++)
			check(h.deny[i].prefix <= 32 &&
			      (h.deny[i].prefix == 32 || !(h.deny[i].addr & (0xffffffffu >> h.deny[i].prefix))));
	}
	config_free(&c);
	return 0;
}
