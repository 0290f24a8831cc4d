#include "lib/exec/window_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/string_view.h"
#include "lib/core/stopwatch.h"

namespace reshard {

void WindowPipeline::Prepare(Buffers& buffers, size_t window_bytes) {
  const size_t half = std::max<size_t>(window_bytes / 2, 4096);
  for (PageBuffer& buffer : buffers) {
    if (buffer.size() < half) buffer = PageBuffer(half);
  }
}

WindowPipeline::WindowPipeline(ByteWriter& sink, Buffers& buffers)
    : sink_(sink), buffers_(buffers) {
  writer_ = std::thread([this] { WriterLoop(); });
}

WindowPipeline::~WindowPipeline() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
}

absl::Status WindowPipeline::Submit(size_t used, std::function<absl::Status()> ready) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &WindowPipeline::WriterIdle));
  if (!status_.ok()) return status_;
  pending_ = filling_;
  pending_bytes_ = used;
  pending_ready_ = std::move(ready);
  filling_ = 1 - filling_;
  return absl::OkStatus();
}

double WindowPipeline::sink_seconds() {
  absl::MutexLock lock(&mu_);
  return sink_seconds_;
}

absl::Status WindowPipeline::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &WindowPipeline::WriterIdle));
  return status_;
}

void WindowPipeline::WriterLoop() {
  while (true) {
    int index;
    size_t bytes;
    std::function<absl::Status()> ready;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WindowPipeline::HasWork));
      if (pending_ < 0) return;  // stopping with nothing left
      index = pending_;
      bytes = pending_bytes_;
      ready = std::move(pending_ready_);
    }
    absl::Status status = ready ? ready() : absl::OkStatus();
    // Only this thread touches the chain while a buffer is pending.
    const Clock::time_point start = Clock::now();
    if (status.ok()) status = sink_.Write(absl::string_view(buffers_[index].data(), bytes));
    const double seconds = SecondsSince(start);
    absl::MutexLock lock(&mu_);
    sink_seconds_ += seconds;
    if (!status.ok() && status_.ok()) status_ = status;
    pending_ = -1;
  }
}

}  // namespace reshard
