/* condwait: wait on a condition variable until a deadline on a struct
 * kiln_clock's monotonic time (lib/clock.h). With the system clock that is
 * one timed wait; with a test's clock, moved by hand, it is one short real
 * slice, reported as a wake-up, so that the caller's loop looks at the clock
 * (and at its condition) again. Callers therefore always loop, rechecking
 * their condition, as with any condition variable. Used by the modules that
 * take a clock and sleep on it (hostd's uploaders, the pool's refill
 * thread). */
#ifndef KILN_CONDWAIT_H
#define KILN_CONDWAIT_H

#include <pthread.h>
#include <stdint.h>

#include "clock.h"

/* Real milliseconds a wait on a clock other than clock_system lasts. */
#define CONDWAIT_SLICE_MS 5

/* Initialise c to time its waits with CLOCK_MONOTONIC, as condwait_until
 * requires. Returns pthread_cond_init's result. */
int condwait_init(pthread_cond_t *c);

/* With mu held: wait for c to be signalled, at most until deadline_ms of
 * clk's monotonic time (clk NULL: the system clock). Returns ETIMEDOUT when
 * the deadline has passed, else 0 (signalled, or a spurious or slice
 * wake-up: recheck and wait again). mu is held again on return. */
int condwait_until(pthread_cond_t *c, pthread_mutex_t *mu, const struct kiln_clock *clk, int64_t deadline_ms);

/* *flag, read with mu held (taken and released here): a flag such as
 * "stopping" that another thread sets under mu and then signals. */
int condwait_flag(pthread_mutex_t *mu, const int *flag);

#endif
