// Wall time of a phase (planning, writing, publishing) for results and progress: a monotonic
// clock, so a clock step (NTP) cannot make a phase negative.

#ifndef RESHARD_LIB_CORE_STOPWATCH_H_
#define RESHARD_LIB_CORE_STOPWATCH_H_

#include <chrono>

namespace reshard {

using Clock = std::chrono::steady_clock;

// Seconds from `start` to now.
inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_STOPWATCH_H_
