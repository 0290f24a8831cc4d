#include "server/job_result.h"

#include <cstdint>
#include <map>
#include <string>

#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

v1::Job ParseJob(const std::string& text) {
  v1::Job job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &job)) << text;
  return job;
}

void ExpectJob(const v1::Job& actual, const std::string& expected_text) {
  const v1::Job expected = ParseJob(expected_text);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(actual, expected))
      << "actual:\n"
      << actual.DebugString() << "expected:\n"
      << expected.DebugString();
}

// Every figure of a successful attempt lands in its field; the output files replace what an
// earlier attempt listed, the committed files (kept for a resume) are cleared, and the rest of
// the record is left as it was.
TEST(JobResultTest, SetJobResultMapsEveryFigure) {
  v1::Job job = ParseJob(R"pb(
    id: "j-1"
    attempts: 2
    note: "resumed"
    output_files { name: "stale.bin" bytes: 1 xxh3_64: "0000000000000001" }
    committed_files { name: "a.safetensors" bytes: 10 xxh3_64: "00000000000000aa" }
  )pb");
  ConversionResult result;
  result.bytes_read = 1000;
  result.bytes_written = 2000;
  result.reused_files = 1;
  result.reused_bytes = 10;
  result.plan_seconds = 1.5;
  result.data_files_seconds = 2.5;
  result.publish_seconds = 3.5;
  result.data_phases.read = 0.25;
  result.data_phases.convert = 0.5;
  result.data_phases.write = 0.75;
  result.data_phases.fsync = 1.25;
  result.data_phases.verify = 1.75;
  result.files.push_back({"a.safetensors", 10, 0xaa, 1});
  result.files.push_back({"model.safetensors.index.json", 77, 0x0123456789abcdefull, 0});
  SetJobResult(result, job);
  ExpectJob(job, R"pb(
    id: "j-1"
    attempts: 2
    note: "resumed"
    bytes_read: 1000
    bytes_written: 2000
    reused_files: 1
    reused_bytes: 10
    timings {
      plan_seconds: 1.5
      write_seconds: 2.5
      publish_seconds: 3.5
      read_seconds: 0.25
      convert_seconds: 0.5
      write_io_seconds: 0.75
      fsync_seconds: 1.25
      verify_seconds: 1.75
    }
    output_files { name: "a.safetensors" bytes: 10 xxh3_64: "00000000000000aa" }
    output_files { name: "model.safetensors.index.json" bytes: 77 xxh3_64: "0123456789abcdef" }
  )pb");
}

// An output an earlier attempt had published is noted with that attempt's number.
TEST(JobResultTest, SetJobResultNotesAnOutputFoundPublished) {
  v1::Job job = ParseJob(R"pb(attempts: 3)pb");
  ConversionResult result;
  result.found_published = true;
  SetJobResult(result, job);
  EXPECT_EQ(job.note(),
            "the output was published by attempt 2, which was interrupted before recording "
            "success; every file was checked against its manifest");
}

TEST(JobResultTest, SetJobProgressCopiesEveryCounter) {
  v1::Job job = ParseJob(R"pb(id: "j-2")pb");
  Progress progress;
  progress.bytes_done = 1;
  progress.bytes_total = 2;
  progress.tensors_done = 3;
  progress.tensors_total = 4;
  progress.files_done = 5;
  progress.files_total = 6;
  SetJobProgress(progress, job);
  ExpectJob(job, R"pb(
    id: "j-2"
    progress {
      bytes_done: 1
      bytes_total: 2
      tensors_done: 3
      tensors_total: 4
      files_done: 5
      files_total: 6
    }
  )pb");
}


}  // namespace
}  // namespace reshard
