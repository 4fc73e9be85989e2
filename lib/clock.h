/* clock: the one place kiln reads the time. clock_wall_ms() is for
 * timestamps that leave the process (results, rows, events); clock_mono_ms()
 * and clock_mono_us() for deadlines and durations. Header-only so that the
 * static guest binary (kiln-init) uses it too.
 *
 * struct kiln_clock is the seam for tests: modules whose decisions depend on
 * time (the scheduler, the session reaper, the pool, hostd's recovery) take
 * one, and cmocka tests pass a clock they move by hand. clock_system is the
 * real one. */
#ifndef KILN_CLOCK_H
#define KILN_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t clock_ns_(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
static inline int64_t clock_wall_ms(void)
{
	return clock_ns_(CLOCK_REALTIME) / 1000000;
}

/* Milliseconds / microseconds of CLOCK_MONOTONIC: never jumps, only for
 * differences. */
static inline int64_t clock_mono_ms(void)
{
	return clock_ns_(CLOCK_MONOTONIC) / 1000000;
}

static inline int64_t clock_mono_us(void)
{
	return clock_ns_(CLOCK_MONOTONIC) / 1000;
}

/* A clock a module can be handed. Both callbacks get ctx. */
struct kiln_clock {
	int64_t (*wall_ms)(void *ctx);
	int64_t (*mono_ms)(void *ctx);
	void *ctx;
};

/* The real clocks (lib/clock.c). */
extern const struct kiln_clock clock_system;

/* c's time; c NULL means clock_system. */
static inline int64_t kclock_wall_ms(const struct kiln_clock *c)
{
	return c ? c->wall_ms(c->ctx) : clock_wall_ms();
}

static inline int64_t kclock_mono_ms(const struct kiln_clock *c)
{
	return c ? c->mono_ms(c->ctx) : clock_mono_ms();
}

#endif
