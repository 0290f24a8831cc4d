#include "lib/exec/window_pipeline.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

// Collects what it is given; fails every Write from the `fail_at`-th on (0: never).
class CollectingWriter final : public ByteWriter {
 public:
  explicit CollectingWriter(int fail_at = 0) : fail_at_(fail_at) {}
  absl::Status Write(absl::string_view data) override {
    if (fail_at_ > 0 && ++writes_ >= fail_at_) return absl::DataLossError("disk said no");
    bytes_.append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Close() override { return absl::OkStatus(); }
  uint64_t pos() const override { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  const int fail_at_;
  int writes_ = 0;
  std::string bytes_;
};

// Fills the pipeline's buffer with `text` and submits it.
absl::Status SubmitText(WindowPipeline& pipeline, const std::string& text) {
  EXPECT_LE(text.size(), pipeline.capacity());
  std::memcpy(pipeline.buffer(), text.data(), text.size());
  return pipeline.Submit(text.size());
}

// Windows reach the writer whole and in order, alternating between the two buffers, and the
// buffers serve the next file again without being mapped anew.
TEST(WindowPipelineTest, WritesWindowsInOrderAndReusesTheBuffers) {
  WindowPipeline::Buffers buffers;
  WindowPipeline::Prepare(buffers, 8192);
  ASSERT_EQ(buffers[0].size(), 4096u);
  ASSERT_EQ(buffers[1].size(), 4096u);
  const char* const first = buffers[0].data();
  for (int file = 0; file < 2; ++file) {
    CollectingWriter sink;
    {
      WindowPipeline pipeline(sink, buffers);
      EXPECT_EQ(pipeline.capacity(), 4096u);
      for (const std::string& text :
           std::vector<std::string>{"one,", "two,", "three,", std::string(4096, 'x')}) {
        ASSERT_TRUE(SubmitText(pipeline, text).ok());
      }
      ASSERT_TRUE(pipeline.Finish().ok());
    }
    EXPECT_EQ(sink.bytes(), "one,two,three," + std::string(4096, 'x'));
    WindowPipeline::Prepare(buffers, 8192);
    EXPECT_EQ(buffers[0].data(), first);
  }
}

// The writer's error comes back from the next Submit or from Finish, and stays.
TEST(WindowPipelineTest, WriterErrorReturnsFromSubmitAndFinish) {
  WindowPipeline::Buffers buffers;
  WindowPipeline::Prepare(buffers, 8192);
  CollectingWriter sink(/*fail_at=*/2);
  WindowPipeline pipeline(sink, buffers);
  ASSERT_TRUE(SubmitText(pipeline, "kept,").ok());
  ASSERT_TRUE(SubmitText(pipeline, "lost,").ok());  // handed over; its write fails
  const absl::Status submitted = SubmitText(pipeline, "refused");
  EXPECT_EQ(submitted, absl::DataLossError("disk said no"));
  EXPECT_EQ(pipeline.Finish(), absl::DataLossError("disk said no"));
  EXPECT_EQ(sink.bytes(), "kept,");
}

}  // namespace
}  // namespace reshard
