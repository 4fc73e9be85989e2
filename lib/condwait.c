/* condwait: timed condition waits on a struct kiln_clock's time. */
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

static void wait_real_ms(pthread_cond_t *c, pthread_mutex_t *mu, int64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(c, mu, &ts);
}

int condwait_flag(pthread_mutex_t *mu, const int *flag)
{
	int v;

	pthread_mutex_lock(mu);
	v = *flag;
	pthread_mutex_unlock(mu);
	return v;
}

int condwait_until(pthread_cond_t *c, pthread_mutex_t *mu, const struct kiln_clock *clk, int64_t deadline_ms)
{
	int64_t left = deadline_ms - kclock_mono_ms(clk);

	if (left <= 0)
		return ETIMEDOUT;
	/* Another clock may jump past the deadline at any moment: look again
	 * soon. (Whether a wait ended by a signal or by its timeout cannot be
	 * told apart reliably, hence the clock decides.) */
	wait_real_ms(c, mu, clk && clk != &clock_system && left > CONDWAIT_SLICE_MS ? CONDWAIT_SLICE_MS : left);
	return kclock_mono_ms(clk) >= deadline_ms ? ETIMEDOUT : 0;
}
