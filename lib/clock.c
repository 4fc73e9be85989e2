/* clock: the real clocks behind struct kiln_clock (lib/clock.h). */
#include "clock.h"

static int64_t system_wall_ms(void *ctx)
{
	(void)ctx;
	return clock_wall_ms();
}

static int64_t system_mono_ms(void *ctx)
{
	(void)ctx;
	return clock_mono_ms();
}

const struct kiln_clock clock_system = {system_wall_ms, system_mono_ms, 0};
