/* test_fork_base: the list of fork bases a host keeps
 * (host/session/session_fork.c): at most FORK_MAX (4) are kept, the oldest
 * going first, but a base whose upload still goes on stays past that bound,
 * so that its snapshot's DELETE finds it and waits for the upload; once the
 * upload ends the bound applies again; a failed one is never found; a
 * snapshot's own drop takes its base whatever its state. Memfds only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "session_int.h"

static struct fork_base *base(const char *snap)
{
	struct kiln_err e = { .code = "" };
	int ram = memfd_create("test-ram", MFD_CLOEXEC);
	struct fork_base *fb;

	assert_true(ram >= 0);
	assert_int_equal(ftruncate(ram, 1 << 20), 0);
	assert_int_equal(pwrite(ram, "x", 1, 4096), 1);
	fb = fork_base_new(ram, 1 << 20, "tpl", &e);
	close(ram);
	assert_non_null(fb);
	fork_base_publish(fb, "acme", snap, "g1");
	return fb;
}

static int found(const char *snap)
{
	struct fork_base *fb = fork_base_find("acme", snap);

	fork_base_put(fb);
	return fb != NULL;
}

static void uploading_base_outlives_the_bound(void **state)
{
	struct fork_base *fb[6];
	char name[8];

	for (int i = 0; i < 6; i++) {
		snprintf(name, sizeof(name), "k%d", i);
		fb[i] = base(name);
		if (i)
			fork_base_finish(fb[i], FORK_UPLOADED, NULL);
		fork_base_put(fb[i]); /* the list's reference is what is left */
	}
	/* k0 still uploads: it stays beside the four newest (a look at the
	 * list applies the bound). */
	assert_true(found("k0"));
	assert_int_equal(fork_base_count(), 5);
	assert_false(found("k1"));
	assert_true(found("k5") && found("k2"));

	/* Its upload ends: the next look at the list drops it (the bound). */
	fork_base_finish(fb[0], FORK_UPLOADED, NULL);
	assert_false(found("k0"));
	assert_int_equal(fork_base_count(), 4);

	/* A failed upload is never handed to a child. */
	fork_base_finish(fb[2], FORK_FAILED, NULL);
	assert_false(found("k2"));

	/* The snapshot's DELETE drops its base whatever its state. */
	fork_base_drop("acme", "k5");
	assert_false(found("k5"));
	fork_base_drop_all();
	assert_int_equal(fork_base_count(), 0);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(uploading_base_outlives_the_bound),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
