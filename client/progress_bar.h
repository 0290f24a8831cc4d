// Progress display for reshardctl: a redrawn bar with rate and ETA on a terminal, a plain line
// every 10% otherwise. Writes to the stream given (stderr), never to stdout.

#ifndef RESHARD_CLIENT_PROGRESS_BAR_H_
#define RESHARD_CLIENT_PROGRESS_BAR_H_

#include <chrono>
#include <ostream>

#include "lib/exec/executor.h"

namespace reshard {

class ProgressBar {
 public:
  ProgressBar(std::ostream& out, bool terminal);
  // Thread compatible: the Executor serializes its progress callbacks.
  void Update(const Progress& progress);
  void Finish();

 private:
  std::ostream& out_;
  const bool terminal_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
  int last_decile_ = -1;
  Progress last_{};
  bool last_printed_ = true;
  bool drawn_ = false;
};

// "1.50 GiB".
std::string HumanBytes(double bytes);

}  // namespace reshard

#endif  // RESHARD_CLIENT_PROGRESS_BAR_H_
