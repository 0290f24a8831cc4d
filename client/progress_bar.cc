#include "client/progress_bar.h"

#include <string>

#include "absl/strings/str_format.h"

namespace reshard {

std::string HumanBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.2f %s", bytes, kUnits[unit]);
}

ProgressBar::ProgressBar(std::ostream& out, bool terminal)
    : out_(out), terminal_(terminal), start_(std::chrono::steady_clock::now()) {}

void ProgressBar::Update(const Progress& p) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction =
      p.bytes_total == 0 ? 1.0 : static_cast<double>(p.bytes_done) / p.bytes_total;
  const double rate = elapsed > 0 ? p.bytes_done / elapsed : 0;
  const double eta = rate > 0 ? (p.bytes_total - p.bytes_done) / rate : 0;
  if (terminal_) {
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) &&
        p.bytes_done < p.bytes_total) {
      return;
    }
    last_draw_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    out_ << absl::StrFormat("\r[%s%s] %5.1f%% %s/%s %s/s ETA %ds  files %d/%d tensors %d/%d ",
                            std::string(filled, '#'), std::string(kWidth - filled, '.'),
                            fraction * 100, HumanBytes(p.bytes_done), HumanBytes(p.bytes_total),
                            HumanBytes(rate), static_cast<int>(eta), p.files_done, p.files_total,
                            p.tensors_done, p.tensors_total)
         << std::flush;
    return;
  }
  last_ = p;
  const int decile = static_cast<int>(fraction * 10);
  last_printed_ = decile != last_decile_;
  if (!last_printed_) return;
  last_decile_ = decile;
  out_ << absl::StrFormat("progress: %3d%% %s of %s, %s/s, files %d/%d, tensors %d/%d\n",
                          decile * 10, HumanBytes(p.bytes_done), HumanBytes(p.bytes_total),
                          HumanBytes(rate), p.files_done, p.files_total, p.tensors_done,
                          p.tensors_total)
       << std::flush;
}

void ProgressBar::Finish() {
  if (terminal_) {
    if (drawn_) out_ << "\n" << std::flush;
    return;
  }
  if (!last_printed_) {  // the final state (all files committed) was not shown yet
    last_decile_ = -1;
    Update(last_);
  }
}

}  // namespace reshard
