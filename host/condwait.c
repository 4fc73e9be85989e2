/* condwait: timed condition waits in a struct kiln_clock's time. */
#include "condwait.h"

#include <errno.h>
#include <time.h>

int condwait_init(pthread_cond_t *c)
{
	pthread_condattr_t ca;
	int r;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	r = pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
	return r;
}

static int wait_real_ms(pthread_cond_t *c, pthread_mutex_t *mu, int64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return pthread_cond_timedwait(c, mu, &ts);
}

int condwait_ms(pthread_cond_t *c, pthread_mutex_t *mu, const struct kiln_clock *clk, int64_t ms)
{
	int64_t until;

	if (ms <= 0)
		return ETIMEDOUT;
	if (!clk || clk == &clock_system)
		return wait_real_ms(c, mu, ms);
	until = kclock_mono_ms(clk) + ms;
	for (;;) {
		int r = wait_real_ms(c, mu, CONDWAIT_SLICE_MS);

		if (r != ETIMEDOUT)
			return r;
		if (kclock_mono_ms(clk) >= until)
			return ETIMEDOUT;
	}
}
