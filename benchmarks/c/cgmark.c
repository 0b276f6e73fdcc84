/* Region markers for callgrind, callable from Python through ctypes.
 *
 * benchmarks/hotpath.py zeroes callgrind's counters before a timed region and dumps them
 * after it, named after the region, so every (call, implementation) gets its own exact
 * instruction count. Outside valgrind these client requests are no-ops.
 */
#include <valgrind/callgrind.h>

void cgmark_zero(void) { CALLGRIND_ZERO_STATS; }

void cgmark_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
