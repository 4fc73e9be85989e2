/* fuzz.h: what kiln's libFuzzer targets share: check(), an abort() that
 * names the property that broke, and a walk over the lib/proto frames of an
 * input (for the host-guest protocols). */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define check(cond)                                                             \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                               \
			abort();                                                \
		}                                                               \
	} while (0)

#ifdef KILN_PROTO_H
/* Hand every frame's payload in data to decode, each from an exact-size heap
 * copy so that ASan sees any read past it. A header that can never be valid
 * resynchronises one byte on, to reach the frames after it. */
static inline void fuzz_each_frame(const uint8_t *data, size_t size, void (*decode)(const uint8_t *, size_t))
{
	size_t off = 0;

	while (off < size) {
		struct proto_frame f;
		ssize_t n = proto_frame_parse(data + off, size - off, &f);
		uint8_t *copy;

		if (n == 0)
			break;
		if (n < 0) {
			off++;
			continue;
		}
		check((size_t)n == PROTO_HDR_SIZE + f.len && (size_t)n <= size - off);
		check(f.type != 0 && f.len <= PROTO_MAX_PAYLOAD);
		copy = malloc(f.len ? f.len : 1);
		check(copy != NULL);
		memcpy(copy, f.payload, f.len);
		decode(copy, f.len);
		free(copy);
		off += (size_t)n;
	}
}
#endif

#endif
