#include "lib/exec/executor.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/exec/dtype_convert.h"
#include "lib/exec/tensor_filler.h"
#include "lib/exec/testing/plan_fixture.h"
#include "lib/io/crc32.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/scratch_copy.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/planner.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

// The executor writes through a folder handle, as the staging folder hands it one.
Directory OutputDir(const std::string& path) {
  auto dir = Directory::Open(path);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *std::move(dir) : Directory();
}

namespace fs = std::filesystem;

// MakeCase over a fresh [rows, cols] source split by columns at `split`, and its plan.
struct PlannedCase {
  std::string src;
  Case c;
  CopyPlan plan;
};
PlannedCase PlanCase(int64_t rows, int64_t cols, int64_t split) {
  PlannedCase planned;
  planned.src = MakeTempDir("src");
  const Fixture fixture = MakeSource(planned.src, rows, cols, split);
  planned.c = MakeCase(fixture);
  auto plan = BuildCopyPlan(fixture.catalog, planned.c.layout, planned.c.framings);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) planned.plan = *std::move(plan);
  return planned;
}

void RunAndCompare(int64_t rows, int64_t cols, int64_t split) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, rows, cols, split);
  Case c = MakeCase(fixture);
  auto plan = BuildCopyPlan(fixture.catalog, c.layout, c.framings);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (uint64_t window : {uint64_t{4096}, uint64_t{1}, uint64_t{32} << 20}) {
    for (int threads : {1, 2}) {
      for (IoMode io : {IoMode::kAuto, IoMode::kDirect, IoMode::kBuffered}) {
        SCOPED_TRACE("shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "] window " +
                     std::to_string(window) + " threads " + std::to_string(threads) + " io " +
                     std::string(IoModeName(io)));
        const std::string out = MakeTempDir("out");
        ExecutorOptions options;
        options.threads = threads;
        options.window_bytes = window;
        options.io = io;
        Progress last;
        int calls = 0;
        uint64_t previous_done = 0;
        bool monotonic = true;
        options.on_progress = [&](const Progress& p) {
          if (p.bytes_done < previous_done) monotonic = false;
          previous_done = p.bytes_done;
          last = p;
          ++calls;
        };
        auto result = Execute(*plan, OutputDir(out), options);
        ASSERT_TRUE(result.ok()) << result.status();
        ASSERT_EQ(result->files.size(), 2u);
        uint64_t written = 0;
        for (int f = 0; f < 2; ++f) {
          const std::string path = out + "/" + c.layout.files[f].name;
          const std::string data = ReadAll(path);
          EXPECT_EQ(data.size(), c.expected[f].size()) << path;
          EXPECT_TRUE(data == c.expected[f]) << path << " differs from the direct computation";
          EXPECT_EQ(result->files[f].name, c.layout.files[f].name);
          EXPECT_EQ(result->files[f].bytes, c.expected[f].size());
          EXPECT_EQ(result->files[f].tensors, 2);
          auto hash = HashFile(path);
          ASSERT_TRUE(hash.ok());
          EXPECT_EQ(result->files[f].xxh3_64, *hash);
          EXPECT_FALSE(fs::exists(path + ".partial"));
          written += data.size();
        }
        EXPECT_EQ(result->bytes_written, written);
        EXPECT_EQ(plan->total_bytes, written);
        const uint64_t source_elements =
            rows * cols + (rows - 2) * (cols - 5) + (rows - 1) * cols + rows;
        EXPECT_EQ(result->bytes_read, source_elements * 4);
        EXPECT_GT(calls, 0);
        EXPECT_TRUE(monotonic);
        EXPECT_EQ(last.bytes_total, plan->total_bytes);
        EXPECT_EQ(last.bytes_done, last.bytes_total);
        EXPECT_EQ(last.files_done, 2);
        EXPECT_EQ(last.files_total, 2);
        EXPECT_EQ(last.tensors_done, 4);
        EXPECT_EQ(last.tensors_total, 4);
        // Phase times: every file was filled, written and committed; nothing was verified.
        const PhaseSeconds& phases = result->phases;
        EXPECT_GT(phases.read, 0);     // the F32 tensors "w" and "w_col", copied unchanged
        EXPECT_GT(phases.convert, 0);  // the BF16 and F16 tensors
        EXPECT_GT(phases.write, 0);
        EXPECT_GT(phases.fsync, 0);
        EXPECT_EQ(phases.verify, 0);
        EXPECT_EQ(result->verification_failures, 0);
      }
    }
  }
}

TEST(ExecutorTest, SmallTensorFromColumnPieces) { RunAndCompare(6, 10, 4); }

TEST(ExecutorTest, LargerTensorSpansManyWindows) {
  // 40 KB per copy of the tensor: rows are cut across 4 KiB windows.
  RunAndCompare(57, 181, 97);
}

// The plan of a file `name` holding the one tensor `tensor` and nothing else.
absl::StatusOr<CopyPlan> PlanOneTensor(const Catalog& catalog, const std::string& name,
                                       OutputTensor tensor) {
  TargetLayout layout;
  layout.files.push_back({name, {std::move(tensor)}, {}});
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  return BuildCopyPlan(catalog, layout, {framing});
}

// `plan` executed with a window of `window` bytes into a fresh folder: the bytes of its file
// `name`, and the source bytes read.
struct WindowRun {
  std::string data;
  uint64_t bytes_read = 0;
};
WindowRun RunWithWindow(const CopyPlan& plan, uint64_t window, const std::string& name) {
  const std::string out = MakeTempDir("out");
  ExecutorOptions options;
  options.window_bytes = window;
  auto result = Execute(plan, OutputDir(out), options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  return {ReadAll(out + "/" + name), result->bytes_read};
}

// Rows beyond the source (OutputTensor::zero_fill, a vocabulary padded again) are zeros in
// every dtype, across window boundaries; the rows inside are the source's.
TEST(ExecutorTest, ZeroFilledRowsBeyondTheSource) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 37, 53, 20);
  const Box inside{{30, 0}, {7, 53}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    OutputTensor tensor{"w", 0, Box{{30, 0}, {19, 53}}, dtype};
    tensor.zero_fill = true;
    auto plan = PlanOneTensor(fixture.catalog, "padded.bin", tensor);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string expected =
        Expected(inside, dtype) + std::string(12 * 53 * DTypeSize(dtype), '\0');
    for (uint64_t window : {uint64_t{4096}, uint64_t{1} << 20}) {
      const WindowRun run = RunWithWindow(*plan, window, "padded.bin");
      EXPECT_TRUE(run.data == expected) << DTypeName(dtype) << " window " << window;
      EXPECT_EQ(run.bytes_read, 7u * 53 * 4);
    }
  }
}

// A region of a transposed view (ViewPermuted {1, 0}: a Hugging Face Conv1D weight [in, out]
// from a [out, in] one) of a tensor stored as two column pieces is written as the transpose,
// element by element, in F32 and narrowed to BF16, whatever the window; every source byte is
// read once.
TEST(ExecutorTest, TransposedViewWritesTheTranspose) {
  const std::string src = MakeTempDir("src");
  const int64_t rows = 45, cols = 131;
  Fixture fixture = MakeSource(src, rows, cols, 50);
  Catalog catalog = fixture.catalog;
  auto transposed = ViewPermuted(catalog.tensors[0], {1, 0});
  ASSERT_TRUE(transposed.ok()) << transposed.status();
  ASSERT_EQ(transposed->shape, (Shape{cols, rows}));
  catalog.tensors.push_back(*transposed);
  const int source = static_cast<int>(catalog.tensors.size()) - 1;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // Rows 3.. of the transpose: columns 3.. of the source, across both pieces.
    const Box region{{3, 0}, {cols - 3, rows}};
    auto plan = PlanOneTensor(catalog, "t.bin", OutputTensor{"t", source, region, dtype});
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::string expected;
    for (int64_t c = 3; c < cols; ++c) {
      expected += Expected(Box{{0, c}, {rows, 1}}, dtype);
    }
    for (uint64_t window : {uint64_t{4096}, uint64_t{1} << 20}) {
      const WindowRun run = RunWithWindow(*plan, window, "t.bin");
      EXPECT_TRUE(run.data == expected) << DTypeName(dtype) << " window " << window;
      EXPECT_EQ(run.bytes_read, uint64_t(rows) * (cols - 3) * 4);
    }
  }
}

// ViewPermuted refuses an order that is not a permutation of the tensor's dimensions.
TEST(ExecutorTest, ViewPermutedRefusesAnOrderThatIsNoPermutation) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 4, 6, 2);
  auto bad = ViewPermuted(fixture.catalog.tensors[0], {1, 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("dimension order [1, 1] is not a permutation of its 2 "
                                   "dimensions"));
}

// OutputTensor::mean_of: the element-wise mean of three float32 tensors (one of them split in
// two column pieces), in PyTorch's order ((0 + a) + b + c) / 3, across window boundaries; a
// -0.0 in every term comes out +0.0 as in PyTorch (0 + -0.0 is +0.0).
TEST(ExecutorTest, MeanOfTensorsInTorchOrder) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 37, 53, 20);
  Catalog& catalog = fixture.catalog;
  auto term = [](int k, int64_t r, int64_t c) {
    if (r == 3 && c == 4) return -0.0f;
    return k == 0 ? Value(r, c) : Value(r, c) * (k == 1 ? -0.7f : 1.3f) + 0.1f * k;
  };
  for (int k = 1; k <= 2; ++k) {
    std::string bytes;
    for (int64_t r = 0; r < 37; ++r) {
      for (int64_t c = 0; c < 53; ++c) bytes += EncodeElement(term(k, r, c), DType::kF32);
    }
    const std::string path = absl::StrCat(src, "/term", k, ".bin");
    WriteAll(path, bytes);
    catalog.files.push_back({path, bytes.size()});
    CatalogTensor tensor{absl::StrCat("w", k), DType::kF32, {37, 53}, {}};
    tensor.pieces.push_back(
        {static_cast<int>(catalog.files.size()) - 1, 0, Box::Full({37, 53}), {53, 1}});
    catalog.tensors.push_back(tensor);
  }
  // Element (3, 4) of the first term is -0.0 too.
  std::string first = ReadAll(src + "/a.bin");
  const float negative_zero = -0.0f;
  std::memcpy(first.data() + 16 + (3 * 20 + 4) * 4, &negative_zero, 4);
  WriteAll(src + "/a.bin", first);
  catalog.Reindex();
  const Box region{{2, 0}, {30, 53}};
  TargetLayout layout;
  OutputTensor mean{"mean", 0, region, DType::kF32};
  mean.mean_of = {0, 1, 2};
  layout.files.push_back({"mean.bin", {mean}, {}});
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  auto plan = BuildCopyPlan(catalog, layout, {framing});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::string expected;
  for (int64_t r = 2; r < 32; ++r) {
    for (int64_t c = 0; c < 53; ++c) {
      float sum = 0.0f + term(0, r, c);
      sum += term(1, r, c);
      sum += term(2, r, c);
      expected += EncodeElement(sum / 3.0f, DType::kF32);
    }
  }
  for (uint64_t window : {uint64_t{4096}, uint64_t{1} << 20}) {
    const std::string out = MakeTempDir("out");
    ExecutorOptions options;
    options.window_bytes = window;
    auto result = Execute(*plan, OutputDir(out), options);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::string got = ReadAll(out + "/mean.bin");
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_TRUE(got == expected) << "window " << window;
    float zero;
    std::memcpy(&zero, got.data() + (1 * 53 + 4) * 4, 4);
    EXPECT_EQ(Bits(zero), 0u) << "-0.0 terms must average to +0.0";
    EXPECT_EQ(result->bytes_read, 3u * 30 * 53 * 4);
  }
  // Terms of another dtype or shape are refused when planning.
  OutputTensor wrong = mean;
  wrong.dtype = DType::kBF16;
  layout.files[0].tensors = {wrong};
  EXPECT_FALSE(BuildCopyPlan(catalog, layout, {framing}).ok());
}

TEST(ExecutorTest, CancelledLeavesNoFile) {
  const PlannedCase planned = PlanCase(6, 10, 4);
  const Case& c = planned.c;
  const CopyPlan* plan = &planned.plan;
  const std::string out = MakeTempDir("out");
  std::atomic<bool> cancelled{true};
  ExecutorOptions options;
  options.window_bytes = 4096;
  options.cancelled = &cancelled;
  auto result = Execute(*plan, OutputDir(out), options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_TRUE(fs::is_empty(out)) << "files left in the output folder";
}

TEST(ExecutorTest, ChangedSourceIsDataLoss) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 6, 10, 4);
  Case c = MakeCase(fixture);
  auto plan = BuildCopyPlan(fixture.catalog, c.layout, c.framings);
  ASSERT_TRUE(plan.ok());
  WriteAll(src + "/b.bin", "shrunk");
  const std::string out = MakeTempDir("out");
  auto result = Execute(*plan, OutputDir(out), ExecutorOptions());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_NE(result.status().message().find("b.bin"), absl::string_view::npos) << result.status();
  EXPECT_TRUE(fs::is_empty(out));
}

// On resume, files recorded as committed are checksummed (the verify phase); one whose
// checksum no longer matches is a verification failure and is written again.
TEST(ExecutorTest, ResumeVerifiesCommittedFiles) {
  const PlannedCase planned = PlanCase(57, 181, 97);
  const Case& c = planned.c;
  const CopyPlan* plan = &planned.plan;
  const std::string out = MakeTempDir("out");
  auto first = Execute(*plan, OutputDir(out), ExecutorOptions());
  ASSERT_TRUE(first.ok()) << first.status();

  ExecutorOptions options;
  options.completed_files[first->files[0].name] = first->files[0].xxh3_64;
  options.completed_files[first->files[1].name] = first->files[1].xxh3_64 ^ 1;  // stale record
  auto resumed = Execute(*plan, OutputDir(out), options);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->verification_failures, 1);
  EXPECT_GT(resumed->phases.verify, 0);
  EXPECT_EQ(ReadAll(out + "/" + c.layout.files[1].name), c.expected[1]);
}

// An OutputSink that keeps files in memory: a file appears in `committed` only when its
// writer is closed, and writers destroyed unclosed are counted as abandoned.
class MemorySink final : public OutputSink {
 public:
  // Writers fail their Write once `fail_after_bytes` bytes went into the sink (0: never).
  explicit MemorySink(uint64_t fail_after_bytes = 0) : fail_after_bytes_(fail_after_bytes) {}

  absl::StatusOr<std::unique_ptr<ByteWriter>> Open(const std::string& name,
                                                   uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    opened_[name] = bytes;
    return std::unique_ptr<ByteWriter>(new Writer(this, name));
  }

  std::map<std::string, std::string> committed() {
    absl::MutexLock lock(&mu_);
    return committed_;
  }
  std::map<std::string, uint64_t> opened() {
    absl::MutexLock lock(&mu_);
    return opened_;
  }
  int abandoned() {
    absl::MutexLock lock(&mu_);
    return abandoned_;
  }

 private:
  class Writer final : public ByteWriter {
   public:
    Writer(MemorySink* sink, std::string name) : sink_(sink), name_(std::move(name)) {}
    ~Writer() override {
      if (closed_) return;
      absl::MutexLock lock(&sink_->mu_);
      ++sink_->abandoned_;
    }
    absl::Status Write(absl::string_view data) override {
      absl::MutexLock lock(&sink_->mu_);
      sink_->total_ += data.size();
      if (sink_->fail_after_bytes_ > 0 && sink_->total_ > sink_->fail_after_bytes_) {
        return absl::UnavailableError(absl::StrCat("sink failed writing ", name_));
      }
      data_.append(data.data(), data.size());
      pos_ += data.size();
      return absl::OkStatus();
    }
    absl::Status Close() override {
      closed_ = true;
      absl::MutexLock lock(&sink_->mu_);
      sink_->committed_[name_] = std::move(data_);
      return absl::OkStatus();
    }
    uint64_t pos() const override { return pos_; }

   private:
    MemorySink* const sink_;
    const std::string name_;
    std::string data_;
    uint64_t pos_ = 0;  // stays after Close, as a file's size does
    bool closed_ = false;
  };

  const uint64_t fail_after_bytes_;
  absl::Mutex mu_;
  std::map<std::string, std::string> committed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> opened_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int abandoned_ ABSL_GUARDED_BY(mu_) = 0;
};

// Through a sink, every file gets the same bytes and XXH3-64 as written into a folder.
TEST(ExecutorTest, SinkGetsTheSameBytesAsAFolder) {
  const PlannedCase planned = PlanCase(57, 181, 97);
  const Case& c = planned.c;
  const std::string out = MakeTempDir("out");
  auto local = Execute(planned.plan, OutputDir(out), ExecutorOptions());
  ASSERT_TRUE(local.ok()) << local.status();
  for (int threads : {1, 2}) {
    for (uint64_t window : {uint64_t{4096}, uint64_t{32} << 20}) {
      SCOPED_TRACE(absl::StrCat("threads ", threads, " window ", window));
      MemorySink sink;
      ExecutorOptions options;
      options.threads = threads;
      options.window_bytes = window;
      std::vector<std::string> committed_names;
      options.on_file_committed = [&](const WrittenFile& file) {
        committed_names.push_back(file.name);
      };
      auto result = Execute(planned.plan, sink, options);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->files.size(), 2u);
      EXPECT_EQ(committed_names.size(), 2u);
      const std::map<std::string, std::string> committed = sink.committed();
      for (int f = 0; f < 2; ++f) {
        const std::string& name = c.layout.files[f].name;
        ASSERT_EQ(committed.count(name), 1u) << name;
        EXPECT_EQ(committed.at(name), c.expected[f]) << name;
        EXPECT_EQ(sink.opened().at(name), c.expected[f].size()) << name;
        EXPECT_EQ(result->files[f].xxh3_64, local->files[f].xxh3_64) << name;
        EXPECT_EQ(result->files[f].bytes, local->files[f].bytes) << name;
      }
      EXPECT_EQ(result->bytes_written, local->bytes_written);
      EXPECT_EQ(result->direct_files, 0);
      EXPECT_EQ(result->buffered_files, 2);
      EXPECT_EQ(sink.abandoned(), 0);
    }
  }
}

// A failing or cancelled sink writer is destroyed unclosed: nothing is committed through it.
TEST(ExecutorTest, SinkErrorsAndCancellationCommitNothingPartial) {
  const PlannedCase planned = PlanCase(57, 181, 97);
  const Case& c = planned.c;
  {
    MemorySink sink(/*fail_after_bytes=*/10000);
    ExecutorOptions options;
    options.threads = 1;
    options.window_bytes = 4096;
    auto result = Execute(planned.plan, sink, options);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
    EXPECT_NE(result.status().message().find("sink failed writing full.bin"),
              absl::string_view::npos)
        << result.status();
    EXPECT_TRUE(sink.committed().empty());
    EXPECT_EQ(sink.abandoned(), 1);
  }
  {
    MemorySink sink;
    std::atomic<bool> cancelled{true};
    ExecutorOptions options;
    options.window_bytes = 4096;
    options.cancelled = &cancelled;
    auto result = Execute(planned.plan, sink, options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
    EXPECT_TRUE(sink.committed().empty());
  }
}

// Files a sink already holds (checked by the caller) are not opened again: they are reported
// with the listed XXH3-64, counted as reused, and their bytes count in bytes_written.
TEST(ExecutorTest, SinkReusesTheFilesItHolds) {
  const PlannedCase planned = PlanCase(57, 181, 97);
  const Case& c = planned.c;
  MemorySink first;
  auto written = Execute(planned.plan, first, ExecutorOptions());
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->files.size(), 2u);

  MemorySink sink;
  ExecutorOptions options;
  options.completed_files[written->files[0].name] = written->files[0].xxh3_64;
  std::vector<std::string> committed_names;
  options.on_file_committed = [&](const WrittenFile& file) {
    committed_names.push_back(file.name);
  };
  auto resumed = Execute(planned.plan, sink, options);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(sink.opened().count(c.layout.files[0].name), 0u);
  EXPECT_EQ(sink.committed().at(c.layout.files[1].name), c.expected[1]);
  EXPECT_EQ(committed_names.size(), 2u);
  ASSERT_EQ(resumed->files.size(), 2u);
  for (int f = 0; f < 2; ++f) {
    EXPECT_EQ(resumed->files[f].xxh3_64, written->files[f].xxh3_64);
    EXPECT_EQ(resumed->files[f].bytes, written->files[f].bytes);
  }
  EXPECT_EQ(resumed->reused_files, 1);
  EXPECT_EQ(resumed->reused_bytes, written->files[0].bytes);
  EXPECT_EQ(resumed->buffered_files, 1);
  EXPECT_EQ(resumed->bytes_written, written->bytes_written);
}

TEST(ExecutorTest, EstimateExecutionMemoryIsBounded) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 57, 181, 97);
  Case c = MakeCase(fixture);
  auto plan = BuildCopyPlan(fixture.catalog, c.layout, c.framings);
  ASSERT_TRUE(plan.ok());
  ExecutorOptions options;
  options.threads = 2;
  options.window_bytes = 4096;  // smaller than every output file
  const uint64_t estimate = EstimateExecutionMemory(*plan, options);
  EXPECT_GE(estimate, 2u * 4096u);  // at least the two windows
  EXPECT_LT(estimate, 1u << 20);
  // A larger window costs more.
  options.window_bytes = 16384;
  EXPECT_GT(EstimateExecutionMemory(*plan, options), estimate);
}

// The local copies of strided items of remote sources (TensorFiller::kStagedMemoryBytes) count
// in the estimate, once per worker; strided items of local sources, read through the mapping,
// do not.
TEST(ExecutorTest, EstimateExecutionMemoryCountsStagedCopies) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 57, 181, 97);
  auto plan = WholeTensorPlan(fixture);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExecutorOptions options;
  CopyPlan strided = *plan;
  for (CopyItem& item : strided.files[0].tensors[0].items) item.src_strides.back() = 2;
  EXPECT_EQ(EstimateExecutionMemory(strided, options), EstimateExecutionMemory(*plan, options));
  for (CopyPlan* remote : {&*plan, &strided}) {
    for (SourceFile& source : remote->sources) source.path = "mem://bucket" + source.path;
  }
  EXPECT_EQ(EstimateExecutionMemory(strided, options), EstimateExecutionMemory(*plan, options) +
                                                           TensorFiller::kStagedMemoryBytes +
                                                           ScratchCopy::kPieceBytes);
}

// A split under --io auto: the sources are read once, but in boxes of whole rows (read
// directly) and in strips of rows (buffered, MappedFile::set_direct_reads_dense_only). Every
// output is the box it asked for, whatever the window and the number of workers.
TEST(ExecutorTest, SplitReadsRowBoxesDirectlyAndStripsBuffered) {
  const std::string src = MakeTempDir("src");
  const int64_t rows = 300, cols = 181, split = 97;
  Fixture fixture = MakeSource(src, rows, cols, split);
  const int64_t half = rows / 2;
  const Box top{{0, 0}, {half, cols}};  // whole rows of both sources
  // Strips: of a.bin; of a.bin and b.bin; of b.bin.
  const Box bottom_left{{half, 0}, {rows - half, 3}};
  const Box bottom_mid{{half, 3}, {rows - half, split}};
  const Box bottom_right{{half, split + 3}, {rows - half, cols - split - 3}};
  auto [layout, framings, expected] = BoxesOfW({{"top.bin", top},
                                                {"bottom_left.bin", bottom_left},
                                                {"bottom_mid.bin", bottom_mid},
                                                {"bottom_right.bin", bottom_right}});
  auto plan = BuildCopyPlan(fixture.catalog, layout, framings);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The path under test: read once, not all in whole boxes.
  for (const SourceReads& reads : AnalyzeSourceReads(*plan)) ASSERT_TRUE(reads.read_once);
  ASSERT_EQ(SourcesReadDense(*plan), std::vector<bool>({false, false}));
  for (uint64_t window : {uint64_t{4096}, uint64_t{32} << 20}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(absl::StrCat("window ", window, " threads ", threads));
      const std::string out = MakeTempDir("out");
      ExecutorOptions options;
      options.threads = threads;
      options.window_bytes = window;
      options.io = IoMode::kAuto;
      auto result = Execute(*plan, OutputDir(out), options);
      ASSERT_TRUE(result.ok()) << result.status();
      for (size_t f = 0; f < expected.size(); ++f) {
        EXPECT_TRUE(ReadAll(out + "/" + layout.files[f].name) == expected[f])
            << layout.files[f].name << " differs from the direct computation";
      }
      EXPECT_EQ(result->bytes_read, static_cast<uint64_t>(rows * cols * 4));
    }
  }
}

// A split whose parts also carry a replicated box (the same box in two files, as norms are in
// every part): the source stays read once with that box as a repeated range, buffered and
// kept cached for the second read while the rest is read directly; every output is right, and
// nothing of the input is left in the page cache at the end.
TEST(ExecutorTest, SplitWithReplicatedBoxKeepsOnlyItBuffered) {
  const std::string src = MakeTempDir("src");
  const int64_t rows = 300, cols = 181, split = 97;
  Fixture fixture = MakeSource(src, rows, cols, split);
  const int64_t half = rows / 2;
  const Box top{{0, 0}, {half, cols}};
  const Box bottom{{half, 3}, {rows - half, cols - 3}};
  const Box replicated{{half, 0}, {rows - half, 3}};  // strips of a.bin, twice
  auto [layout, framings, expected] = BoxesOfW({{"top.bin", top},
                                                {"bottom.bin", bottom},
                                                {"replica_0.bin", replicated},
                                                {"replica_1.bin", replicated}});
  auto plan = BuildCopyPlan(fixture.catalog, layout, framings);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<SourceReads> reads = AnalyzeSourceReads(*plan);
  ASSERT_TRUE(reads[0].read_once);
  ASSERT_EQ(reads[0].repeated.size(), 1u);
  EXPECT_TRUE(reads[1].repeated.empty());
  ::sync();  // dirty pages cannot be dropped
  for (int threads : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("threads ", threads));
    const std::string out = MakeTempDir("out");
    ExecutorOptions options;
    options.threads = threads;
    options.window_bytes = 8192;
    options.io = IoMode::kAuto;
    auto result = Execute(*plan, OutputDir(out), options);
    ASSERT_TRUE(result.ok()) << result.status();
    for (size_t f = 0; f < expected.size(); ++f) {
      EXPECT_TRUE(ReadAll(out + "/" + layout.files[f].name) == expected[f])
          << layout.files[f].name << " differs from the direct computation";
    }
    EXPECT_EQ(CachedPages(src + "/a.bin"), 0);
    EXPECT_EQ(CachedPages(src + "/b.bin"), 0);
  }
}

// Bytes this process has read with read(2) and pread(2) so far (/proc/self/io "rchar").
uint64_t BytesReadByProcess() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}
// Executes `plan` into a new folder with every I/O mode, window (64 KiB, 32 MiB) and number of
// workers (1, 2): each time every file is its expected bytes, and the process reads fewer than
// `max_read` bytes (/proc/self/io rchar).
void ExpectEveryRunReadsLessThan(const CopyPlan& plan, const OneFilePerBox& files,
                                 uint64_t max_read) {
  for (IoMode io : {IoMode::kBuffered, IoMode::kAuto}) {
    for (uint64_t window : {uint64_t{64} << 10, uint64_t{32} << 20}) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(absl::StrCat(IoModeName(io), " window ", window, " threads ", threads));
        const std::string out = MakeTempDir("out");
        ExecutorOptions options;
        options.threads = threads;
        options.window_bytes = window;
        options.io = io;
        const uint64_t before = BytesReadByProcess();
        auto result = Execute(plan, OutputDir(out), options);
        const uint64_t read = BytesReadByProcess() - before;
        ASSERT_TRUE(result.ok()) << result.status();
        for (size_t f = 0; f < files.layout.files.size(); ++f) {
          EXPECT_TRUE(ReadAll(out + "/" + files.layout.files[f].name) == files.expected[f])
              << files.layout.files[f].name;
        }
        EXPECT_LT(read, max_read) << "read " << read << " bytes";
      }
    }
  }
}

// The parts of a column split written in turns read each source row once, not once per part
// (which the same plan took before: 4x the source), and write the right bytes whatever the
// window and the number of workers.
TEST(ExecutorTest, PartsWrittenInTurnsReadTheRowsOnce) {
  // Rows of 16 KiB in a.bin, cut into strips of 4 KiB (and the last column from b.bin); then
  // rows of 16 KiB in each of a.bin and b.bin, each cut into two strips of 8 KiB (a model-
  // parallel checkpoint of 2 parts split into 4: parts 0 and 1 read only a.bin, 2 and 3 only
  // b.bin). The second read each row 1.5x when the four parts took turns in one unit: the
  // strips of a.bin and b.bin evicted each other's spans.
  for (const auto& [cols, split] : {std::pair<int64_t, int64_t>{4096, 4095}, {8192, 4096}}) {
    const std::string src = MakeTempDir("src");
    Fixture fixture = MakeSource(src, 256, cols, split);
    const OneFilePerBox parts = ColumnParts(fixture, 4);
    auto plan = BuildCopyPlan(fixture.catalog, parts.layout, parts.framings);
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(absl::StrCat(cols, " columns"));
    // The parts that read the same rows are written in turns by one worker, which reads every
    // row once.
    ExpectEveryRunReadsLessThan(*plan, parts, 256 * cols * 4 * 5 / 4);
  }
}

// A model-parallel checkpoint of 2 files (a.bin, b.bin: rows of 16 KiB each) split into 4
// parts, each of which also carries a replicated tensor read from a.bin, as every part of a
// metaseq split carries `version`, the position embeddings and the norms of the first source.
// The replicated tensor must not put the four parts in one unit: taking turns, the strips of
// a.bin and b.bin evicted each other's spans and read-aheads (a 1 GiB metaseq split read 1.45x
// its input from the disk). The parts that read strips of a.bin make one unit, those of b.bin
// another, and each row is read once.
TEST(ExecutorTest, ReplicatedTensorLeavesThePartsOfEachSourceInTheirOwnUnit) {
  const std::string src = MakeTempDir("src");
  const int64_t rows = 256, cols = 8192, split = 4096;
  Fixture fixture = MakeSource(src, rows, cols, split);
  // Two whole rows of a.bin (contiguous, not strips), in every part.
  const Box replicated{{0, 0}, {2, split}};
  OneFilePerBox parts;
  for (int p = 0; p < 4; ++p) {
    const Box box{{0, cols * p / 4}, {rows, cols / 4}};
    parts.layout.files.push_back(
        {absl::StrCat("part", p, ".bin"),
         {{"version", 0, replicated, DType::kF32}, {"w", 0, box, DType::kF32}},
         {}});
    FileFraming framing;
    framing.segments.push_back({FramingSegment::Kind::kBytes, "HEADER", 0});
    framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
    framing.segments.push_back({FramingSegment::Kind::kTensor, "", 1});
    parts.framings.push_back(framing);
    parts.expected.push_back("HEADER" + Expected(replicated, DType::kF32) +
                             Expected(box, DType::kF32));
  }
  auto plan = BuildCopyPlan(fixture.catalog, parts.layout, parts.framings);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<size_t>> files;
  for (const WorkUnit& unit : WorkUnits(*plan)) {
    files.push_back(unit.files);
    EXPECT_TRUE(unit.whole_rows);
  }
  EXPECT_EQ(files, (std::vector<std::vector<size_t>>{{0, 1}, {2, 3}}));
  ExpectEveryRunReadsLessThan(*plan, parts, rows * cols * 4 * 21 / 20);
}

// IoMode::kAuto writes data files with direct I/O (the test folder is on ext4 or xfs) and
// leaves neither the output nor the input in the page cache; kBuffered leaves both.
TEST(ExecutorTest, AutoIoLeavesThePageCacheAsItWas) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 301, 1100, 500);  // 1.3 MB
  auto plan = WholeTensorPlan(fixture);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string expected = Expected(Box::Full({fixture.rows, fixture.cols}), DType::kF32);
  ::sync();  // dirty pages cannot be dropped
  for (IoMode io : {IoMode::kAuto, IoMode::kBuffered}) {
    SCOPED_TRACE(IoModeName(io));
    const std::string out = MakeTempDir("out");
    ExecutorOptions options;
    options.io = io;
    options.window_bytes = 64 << 10;  // many windows, an unaligned tail
    auto result = Execute(*plan, OutputDir(out), options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->direct_files, io == IoMode::kAuto ? 1 : 0);
    EXPECT_EQ(result->buffered_files, io == IoMode::kAuto ? 0 : 1);
    const std::string path = out + "/whole.bin";
    if (io == IoMode::kAuto) {
      EXPECT_LE(CachedPages(path), 1);
      EXPECT_EQ(CachedPages(src + "/a.bin"), 0);
      EXPECT_EQ(CachedPages(src + "/b.bin"), 0);
    } else {
      EXPECT_GT(CachedPages(path), 100);
      EXPECT_GT(CachedPages(src + "/a.bin"), 100);
    }
    EXPECT_TRUE(ReadAll(path) == expected);
  }
}

// A ZeRO-3 parameter gathered from remote rank files (one run of kGatherElements F32 in each
// of kGatherRanks objects "mem://b/<name>/rank<r>", after a lead of other bytes), written as
// the only tensor of one file, in `dtype`.
constexpr int kGatherRanks = 8;
constexpr int64_t kGatherElements = 16384;  // 64 KiB runs
struct RemoteGather {
  CopyPlan plan;
  std::string expected;  // the output file's bytes
};
RemoteGather MakeRemoteGather(const std::string& name, DType dtype) {
  RemoteGather gather;
  TensorCopy copy;
  copy.name = "layers.0.w";
  copy.num_elements = kGatherRanks * kGatherElements;
  copy.src_dtype = DType::kF32;
  copy.dst_dtype = dtype;
  std::string values;  // the tensor in F32
  for (int r = 0; r < kGatherRanks; ++r) {
    const uint64_t lead = 4096 + 12 + r;
    std::string data = TestPattern(lead, r);
    for (int64_t e = 0; e < kGatherElements; ++e) {
      const float v = static_cast<float>(r * 100000 + e) * (e % 2 == 0 ? 0.5f : -0.25f);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
    values += data.substr(lead);
    data.append(100, 't');
    SourceFile source;
    source.path = absl::StrCat("mem://b/", name, "/rank", r);
    source.size = data.size();
    kvstore::GetMemoryDriver().Put(source.path, std::move(data));
    gather.plan.sources.push_back(source);
    CopyItem item;
    item.src_file = r;
    item.src_offset = lead;
    item.extent = {kGatherElements};
    item.src_strides = {1};
    item.dst_offset = r * kGatherElements;
    item.dst_strides = {1};
    copy.items.push_back(item);
  }
  gather.expected.resize(static_cast<size_t>(copy.num_elements) * DTypeSize(dtype));
  ConvertElements(reinterpret_cast<const std::byte*>(values.data()), 1, DType::kF32,
                  reinterpret_cast<std::byte*>(gather.expected.data()), dtype, copy.num_elements);
  FilePlan file;
  file.name = "gathered.bin";
  FramingSegment segment;
  segment.kind = FramingSegment::Kind::kTensor;
  segment.tensor = 0;
  file.segments.push_back(segment);
  file.tensors.push_back(std::move(copy));
  file.bytes = gather.expected.size();
  gather.plan.files.push_back(std::move(file));
  gather.plan.total_bytes = gather.expected.size();
  gather.plan.source_bytes_read = static_cast<uint64_t>(kGatherRanks * kGatherElements) * 4;
  return gather;
}

// The requests of a gather of remote runs stay in flight across windows: the next window's
// are under way while the current one's are still read (every request is held 200 ms, so
// requests that overlap are seen under way together), the window written once its own are in.
// A window holds 2 runs in F32 and 4 in BF16 (half the 256 KiB window each), one request each:
// two windows' requests at once, where one window's at a time drained the requests in flight
// at every window's end. The bytes are the gathered runs, converted.
TEST(ExecutorTest, RemoteGatherRequestsNextWindowWhileWindowIsRead) {
  kvstore::MemoryDriver* store = &kvstore::GetMemoryDriver();
  store->set_read_delay(absl::Milliseconds(200));
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const RemoteGather gather = MakeRemoteGather(absl::StrCat("gather-", DTypeName(dtype)), dtype);
    const int runs_per_window = dtype == DType::kF32 ? 2 : 4;
    ExecutorOptions options;
    options.threads = 1;
    options.window_bytes = 4 * kGatherElements * 4;
    const std::string out = MakeTempDir("gather");
    const int reads_before = store->reads();
    store->reset_max_concurrent_reads();
    auto result = Execute(gather.plan, OutputDir(out), options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(store->reads() - reads_before, kGatherRanks);
    EXPECT_EQ(store->max_concurrent_reads(), 2 * runs_per_window);
    EXPECT_TRUE(ReadAll(out + "/gathered.bin") == gather.expected);
    EXPECT_EQ(result->bytes_read, gather.plan.source_bytes_read);
  }
  store->set_read_delay(absl::ZeroDuration());
}

// A request of a gather that fails while the next window's are queued fails the file, naming
// the tensor, the object, the run's length and byte offset, with the store's code.
TEST(ExecutorTest, RemoteGatherQueuedRequestErrorsNamed) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string name = absl::StrCat("gather-fails-", DTypeName(dtype));
    const RemoteGather gather = MakeRemoteGather(name, dtype);
    const std::string broken = absl::StrCat("mem://b/", name, "/rank5");
    kvstore::GetMemoryDriver().Fail(broken, absl::UnavailableError("connection reset"));
    ExecutorOptions options;
    options.threads = 1;
    options.window_bytes = 4 * kGatherElements * 4;
    const std::string out = MakeTempDir("gather");
    auto result = Execute(gather.plan, OutputDir(out), options);
    ASSERT_TRUE(absl::IsUnavailable(result.status())) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                testing::HasSubstr(absl::StrCat("tensor \"layers.0.w\": ", broken, ": reading ",
                                                kGatherElements * 4, " bytes at byte offset ",
                                                4096 + 12 + 5)));
    EXPECT_THAT(std::string(result.status().message()), testing::HasSubstr("connection reset"));
    EXPECT_FALSE(fs::exists(out + "/gathered.bin"));
  }
}

// A torch.save archive read from a remote store: kRecords tensors of 2 MiB, each a zip record
// with its CRC-32, 128 bytes of data descriptor and local header before each, in the order
// of their keys as strings rather than the tensors' (`kRecordOf`), written in the tensors'
// order into one file. The window's buffers hold two tensors each. Every tensor is one request
// of 2 MiB into the window, and the next window's requests are under way while the current
// one's are read (each request is held 200 ms, so those that overlap are seen together): four
// at once, two windows' worth. The CRC-32 check reads nothing again.
TEST(ExecutorTest, RemoteTorchSaveRecordsAreReadInWholeRequestsAcrossWindows) {
  constexpr int kRecords = 5;
  constexpr int kRecordOf[kRecords] = {0, 3, 1, 4, 2};  // tensor -> its record in the file
  constexpr uint64_t kRecordBytes = 2 << 20;
  constexpr uint64_t kHeaders = 128;
  const std::string path = "mem://b/torch-records/archive.pt";
  std::string archive;
  std::vector<uint64_t> record_offset(kRecords);
  CopyPlan plan;
  SourceFile source;
  source.path = path;
  for (int r = 0; r < kRecords; ++r) {
    archive += std::string(kHeaders, 'h');
    record_offset[r] = archive.size();
    const std::string data = TestPattern(kRecordBytes, 100 + r);
    source.checksummed.push_back(
        {record_offset[r], kRecordBytes, Crc32(0, data.data(), data.size()),
         absl::StrCat("zip entry \"archive/data/", r, "\"")});
    archive += data;
  }
  archive += std::string(1000, 'c');  // the central directory
  source.size = archive.size();
  plan.sources.push_back(source);
  FilePlan file;
  file.name = "model.bin";
  std::string expected;
  for (int t = 0; t < kRecords; ++t) {
    TensorCopy copy;
    copy.name = absl::StrCat("layers.", t, ".w");
    copy.num_elements = kRecordBytes / 4;
    copy.src_dtype = DType::kF32;
    copy.dst_dtype = DType::kF32;
    CopyItem item;
    item.src_file = 0;
    item.src_offset = record_offset[kRecordOf[t]];
    item.extent = {copy.num_elements};
    item.src_strides = {1};
    item.dst_offset = 0;
    item.dst_strides = {1};
    copy.items.push_back(item);
    FramingSegment segment;
    segment.kind = FramingSegment::Kind::kTensor;
    segment.tensor = t;
    file.segments.push_back(segment);
    file.tensors.push_back(std::move(copy));
    expected += archive.substr(record_offset[kRecordOf[t]], kRecordBytes);
  }
  file.bytes = expected.size();
  plan.files.push_back(std::move(file));
  plan.total_bytes = expected.size();
  plan.source_bytes_read = expected.size();
  kvstore::MemoryDriver* store = &kvstore::GetMemoryDriver();
  store->Put(path, archive);
  store->set_read_delay(absl::Milliseconds(200));
  store->reset_max_concurrent_reads();
  const size_t ranges_before = store->ranges().size();
  ExecutorOptions options;
  options.threads = 1;
  options.window_bytes = 4 * kRecordBytes;
  options.check_source_crc32 = true;
  const std::string out = MakeTempDir("torch-records");
  auto result = Execute(plan, OutputDir(out), options);
  store->set_read_delay(absl::ZeroDuration());
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = store->ranges();
  std::vector<std::pair<uint64_t, uint64_t>> requests(ranges.begin() + ranges_before,
                                                      ranges.end());
  std::sort(requests.begin(), requests.end());
  std::vector<std::pair<uint64_t, uint64_t>> records;
  for (uint64_t offset : record_offset) records.push_back({offset, kRecordBytes});
  EXPECT_EQ(requests, records);
  EXPECT_EQ(store->max_concurrent_reads(), 4);
  EXPECT_EQ(result->crc_bytes_reread, 0u);
  EXPECT_TRUE(ReadAll(out + "/model.bin") == expected);
}

}  // namespace
}  // namespace reshard
