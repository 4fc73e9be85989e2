/* condwait: wait on a condition variable for a span of a struct kiln_clock's
 * time (lib/clock.h). With the system clock that is one timed wait; with a
 * test's clock, moved by hand, the wait is cut into short real slices so
 * that the waiter notices when the test has moved the clock past its
 * deadline. Used by the modules that take a clock and sleep on it (hostd's
 * uploaders, the pool's refill thread). */
#ifndef KILN_CONDWAIT_H
#define KILN_CONDWAIT_H

#include <pthread.h>
#include <stdint.h>

#include "clock.h"

/* Real milliseconds between two looks at a clock that is not clock_system. */
#define CONDWAIT_SLICE_MS 5

/* Initialise c to time its waits with CLOCK_MONOTONIC, as condwait_ms
 * requires. Returns pthread_cond_init's result. */
int condwait_init(pthread_cond_t *c);

/* With mu held: wait until c is signalled or ms of clk's monotonic time have
 * passed (clk NULL: the system clock). Returns 0 when signalled (or woken
 * spuriously: callers recheck their condition), ETIMEDOUT otherwise; mu is
 * held again on return. */
int condwait_ms(pthread_cond_t *c, pthread_mutex_t *mu, const struct kiln_clock *clk, int64_t ms);

#endif
