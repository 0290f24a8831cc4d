// The checks RunConversionToObjectStore makes before it reads the input or writes anything,
// and the reuse of finished data objects by a rerun, against an in-memory S3 (MemoryS3Client
// behind the S3 driver) and the memory driver (mem://). The protocol also runs against a real
// radosgw in //tests/s3:s3_output_test.

#include "lib/engine/object_store_output.h"

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/exec/executor.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_object_writer.h"
#include "lib/io/s3/s3_store.h"
#include "lib/io/s3/testing/memory_s3_client.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

// A client of an endpoint where nothing listens, retrying briefly.
std::unique_ptr<S3Client> UnreachableClient() {
  S3Client::Options options;
  options.config.endpoint = "http://127.0.0.1:1";
  options.config.credentials.access_key_id = "KEY";
  options.config.credentials.secret_access_key = "SECRET";
  options.retry.max_attempts = 2;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(1);
  options.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

ConversionSpec Consolidate(const std::string& input, const std::string& output) {
  ConversionSpec spec;
  spec.input = input;
  spec.output = output;
  return spec;
}

TEST(ObjectStoreOutputTest, RefusedBeforeAnyRequest) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  struct Case {
    ConversionSpec spec;
    absl::StatusCode code;
    std::string message;
  };
  ConversionSpec partitioned = Consolidate("/in", "s3://bucket/out");
  partitioned.partition_count = 2;
  ConversionSpec latest_of_bucket = Consolidate("/in", "s3://bucket");
  latest_of_bucket.update_latest = true;
  const Case cases[] = {
      {partitioned, absl::StatusCode::kUnimplemented, "partitioned"},
      {Consolidate("/in", "s3://Bad_Bucket/out"), absl::StatusCode::kInvalidArgument, "Bad_Bucket"},
      {Consolidate("/in", "s3://bucket/a/../b"), absl::StatusCode::kInvalidArgument, "a/../b"},
      {latest_of_bucket, absl::StatusCode::kInvalidArgument, "whole bucket"},
      {Consolidate("s3://bucket/out/model", "s3://bucket/out"), absl::StatusCode::kInvalidArgument,
       "contains the input s3://bucket/out/model"},
      {Consolidate("s3://bucket/out", "s3://bucket/out/"), absl::StatusCode::kInvalidArgument,
       "contains the input"},
      {Consolidate("s3://bucket/model", "s3://bucket"), absl::StatusCode::kInvalidArgument,
       "contains the input"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.input + " -> " + c.spec.output);
    absl::StatusOr<ConversionResult> result =
        RunConversionToObjectStore(c.spec, {}, S3Store(client.get()));
    EXPECT_EQ(result.status().code(), c.code) << result.status();
    EXPECT_NE(result.status().message().find(c.message), absl::string_view::npos)
        << result.status();
  }
  EXPECT_EQ(client->stats().requests, 0u);
}

// "s3://bucket/out" and "s3://bucket/output": whole segments, so neither contains the other;
// the listing of the output is the first request, and its failure names the output.
TEST(ObjectStoreOutputTest, SiblingPrefixIsNotInsideAndListingErrorsNameTheOutput) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ConversionResult> result = RunConversionToObjectStore(
      Consolidate("s3://bucket/output/model", "s3://bucket/out"), {}, S3Store(client.get()));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find("checking the output s3://bucket/out"),
            absl::string_view::npos)
      << result.status();
  EXPECT_GT(client->stats().requests, 0u);
}

// A safetensors model of four fp32 tensors of `rows` x `cols` (by default 64 KiB; consolidated
// with 70 kB shards, each output file holds one tensor: four data objects and the index).
std::string WriteModel(int64_t rows = 128, int64_t cols = 128) {
  const std::string dir = MakeTempDir("model");
  std::vector<SafetensorsTensorEntry> entries;
  std::string data;
  for (int t = 0; t < 4; ++t) {
    const std::string bytes = TestPattern(rows * cols * 4, t);
    entries.push_back({absl::StrCat("layers.", t, ".weight"),
                       DType::kF32,
                       {rows, cols},
                       data.size(),
                       data.size() + bytes.size()});
    data += bytes;
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  EXPECT_TRUE(header.ok()) << header.status();
  WriteAll(dir + "/model.safetensors", *header + data);
  return dir + "/model.safetensors";
}

constexpr char kBucket[] = "models";
constexpr char kPrefix[] = "ckpt/out/";
constexpr char kManifestKey[] = "ckpt/out/reshard-manifest.json";

std::string DataName(int file) { return absl::StrCat("model-0000", file, "-of-00004.safetensors"); }
std::string DataKey(int file) { return kPrefix + DataName(file); }
std::string RecordKey(int file) {
  return absl::StrCat(kPrefix, kFileRecordsFolder, "/", DataName(file), ".json");
}

// The objects of `client`'s bucket, the manifest without its timestamp.
std::map<std::string, std::string> WithoutTimestamp(const MemoryS3Client& client) {
  std::map<std::string, std::string> objects = client.objects(kBucket);
  if (objects.count(kManifestKey) > 0) {
    nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(objects[kManifestKey]);
    manifest.erase("created_unix");
    objects[kManifestKey] = manifest.dump();
  }
  return objects;
}

// Conversions of the model into s3://models/ckpt/out through an in-memory S3, with one
// thread (data files in plan order).
class ObjectReuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    input_ = WriteModel();
    ASSERT_TRUE(client_.CreateBucket(kBucket).ok());
  }

  ConversionSpec Spec() const {
    ConversionSpec spec = Consolidate(input_, absl::StrCat("s3://", kBucket, "/ckpt/out"));
    spec.max_shard_size = 70'000;
    spec.threads = 1;
    return spec;
  }

  // Runs `spec`, recording the keys of the uploads it completed in `completed_`. When
  // `fail_key` is set, the upload of that key fails to start (Unavailable), as an S3 error or a
  // kill would stop the run there.
  absl::StatusOr<ConversionResult> Run(const ConversionSpec& spec, const std::string& fail_key) {
    completed_.clear();
    client_.set_interceptor([this, fail_key](absl::string_view op, absl::string_view key) {
      if (op == "CreateMultipartUpload" && key == fail_key) {
        return absl::UnavailableError(absl::StrCat("injected failure uploading ", key));
      }
      if (op == "CompleteMultipartUpload") completed_.push_back(std::string(key));
      return absl::OkStatus();
    });
    return RunConversionToObjectStore(spec, {}, S3Store(&client_));
  }

  // The objects under the prefix, with the manifest's timestamp removed.
  std::map<std::string, std::string> Output() const { return WithoutTimestamp(client_); }

  // What an uninterrupted run writes, from a client of its own.
  std::map<std::string, std::string> Uninterrupted() {
    MemoryS3Client fresh;
    EXPECT_TRUE(fresh.CreateBucket(kBucket).ok());
    absl::StatusOr<ConversionResult> result =
        RunConversionToObjectStore(Spec(), {}, S3Store(&fresh));
    EXPECT_TRUE(result.ok()) << result.status();
    return WithoutTimestamp(fresh);
  }

  // Reruns `spec` and expects every data object to be uploaded again, `mismatches` of them
  // counted as verification failures, and the uninterrupted run's output.
  void ExpectRerunUploadsEverything(const ConversionSpec& spec, int mismatches) {
    absl::StatusOr<ConversionResult> rerun = Run(spec, "");
    ASSERT_TRUE(rerun.ok()) << rerun.status();
    EXPECT_EQ(completed_,
              (std::vector<std::string>{DataKey(1), DataKey(2), DataKey(3), DataKey(4)}));
    EXPECT_EQ(rerun->reused_files, 0);
    EXPECT_EQ(rerun->verification_failures, mismatches);
    EXPECT_EQ(Output(), Uninterrupted());
  }

  // A first run that fails when it starts the third data object: objects 1 and 2 are complete
  // and recorded.
  void FailAtTheThirdObject() {
    absl::StatusOr<ConversionResult> failed = Run(Spec(), DataKey(3));
    ASSERT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
    const std::map<std::string, std::string> objects = client_.objects(kBucket);
    EXPECT_EQ(objects.count(kManifestKey), 0u);
    EXPECT_EQ(objects.count(absl::StrCat(kPrefix, kInProgressMarkerName)), 1u);
    for (int file : {1, 2}) {
      EXPECT_EQ(objects.count(DataKey(file)), 1u) << file;
      EXPECT_EQ(objects.count(RecordKey(file)), 1u) << file;
    }
    EXPECT_EQ(objects.count(DataKey(3)), 0u);
  }

  std::string input_;
  MemoryS3Client client_;
  std::vector<std::string> completed_;
};

TEST_F(ObjectReuseTest, RerunAfterAFailureUploadsOnlyTheUnfinishedObjects) {
  FailAtTheThirdObject();
  const std::string first = client_.objects(kBucket).at(DataKey(1));
  absl::StatusOr<ConversionResult> rerun = Run(Spec(), "");
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(completed_, (std::vector<std::string>{DataKey(3), DataKey(4)}));
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->reused_bytes, 2 * first.size());
  EXPECT_EQ(rerun->verification_failures, 0);
  ASSERT_EQ(rerun->files.size(), 5u);  // four data files and the index
  // The output, its manifest (sizes and XXH3-64 of every file) included, is the uninterrupted
  // run's; no record and no marker are left.
  EXPECT_EQ(Output(), Uninterrupted());
}

TEST_F(ObjectReuseTest, ReplacedObjectsAreUploadedAgain) {
  FailAtTheThirdObject();
  std::string same_size = client_.objects(kBucket).at(DataKey(1));
  same_size[100] ^= 1;  // another ETag
  ASSERT_TRUE(client_.Put(kBucket, DataKey(1), same_size).ok());
  ASSERT_TRUE(client_.Put(kBucket, DataKey(2), "shorter").ok());
  ExpectRerunUploadsEverything(Spec(), /*mismatches=*/2);
}

TEST_F(ObjectReuseTest, RecordsOfAnotherPlanOrWithoutTheirObjectAreIgnored) {
  FailAtTheThirdObject();
  // Record 1 rewritten as another plan's (same name, size, digest and ETag); object 2 is
  // complete but its record is gone (a run killed between the object and its record).
  std::string record = client_.objects(kBucket).at(RecordKey(1));
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(record);
  json["plan_id"] = "0123456789abcdef";
  ASSERT_TRUE(client_.Put(kBucket, RecordKey(1), json.dump()).ok());
  ASSERT_TRUE(client_.Delete(kBucket, RecordKey(2)).ok());
  ExpectRerunUploadsEverything(Spec(), /*mismatches=*/0);
}

TEST_F(ObjectReuseTest, ReplacedInputReusesNothing) {
  // The input read from object storage, and replaced after the first run by an object of the
  // same size whose first tensor (the first data object's) differs: the plan id includes the
  // input's version, so the objects finished from the old input are not kept.
  const std::string bytes = ReadAll(input_);
  input_ = "mem://inputs/reuse/model.safetensors";
  kvstore::GetMemoryDriver().Put(input_, bytes);
  FailAtTheThirdObject();
  std::string replaced = bytes;
  replaced[bytes.size() - 4 * 128 * 128 * 4] ^= 1;  // the first data byte
  kvstore::GetMemoryDriver().Put(input_, replaced);
  ExpectRerunUploadsEverything(Spec(), /*mismatches=*/0);
}

TEST_F(ObjectReuseTest, AnotherPlanReusesNothing) {
  FailAtTheThirdObject();
  // The same files, names and sizes, but another request: the plan id differs.
  ConversionSpec other = Spec();
  other.duplicate_tied = true;
  ExpectRerunUploadsEverything(other, /*mismatches=*/0);
}


// Every file of the output `root` on the memory driver with its bytes, the manifest without
// its timestamp.
std::map<std::string, std::string> MemoryOutput(const std::string& root) {
  std::map<std::string, std::string> files = kvstore::ReadTree(kvstore::GetMemoryDriver(), root);
  auto manifest = files.find(kManifestName);
  if (manifest != files.end()) {
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(manifest->second);
    parsed.erase("created_unix");
    manifest->second = parsed.dump();
  }
  return files;
}

// A conversion into mem:// (the memory driver: no rename, files written in place under the
// marker) stopped after two data files and rerun: the rerun keeps exactly the two recorded
// files and its output is an uninterrupted run's. A killed process would take the memory
// driver's files with it, so the first run is stopped by cancelling it once the second file
// is recorded, which leaves the output as a kill there would.
TEST(MemoryOutputTest, RerunAfterAStopReusesExactlyTheRecordedFiles) {
  kvstore::MemoryDriver& driver = kvstore::GetMemoryDriver();
  const std::string root = "mem://outputs/stopped/out";
  ConversionSpec spec = Consolidate(WriteModel(), root);
  spec.max_shard_size = 70'000;
  spec.threads = 1;
  auto url = [&root](int file) { return absl::StrCat(root, "/", DataName(file)); };

  std::atomic<bool> cancelled{false};
  int committed = 0;
  RunControl stopping;
  stopping.cancelled = &cancelled;
  stopping.on_file_committed = [&](const WrittenFile&) {
    if (++committed == 2) cancelled.store(true);
  };
  absl::StatusOr<ConversionResult> stopped = RunAnyConversion(spec, stopping);
  ASSERT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  std::set<std::string> left;
  for (const auto& [name, bytes] : MemoryOutput(root)) left.insert(name);
  EXPECT_EQ(left, (std::set<std::string>{
                      kInProgressMarkerName, DataName(1), DataName(2),
                      absl::StrCat(kFileRecordsFolder, "/", DataName(1), ".json"),
                      absl::StrCat(kFileRecordsFolder, "/", DataName(2), ".json")}));
  const std::string version1 = driver.version(url(1));
  const std::string version2 = driver.version(url(2));

  absl::StatusOr<ConversionResult> rerun = RunAnyConversion(spec, {});
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->output, root);
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->verification_failures, 0);
  // The recorded files were kept (same version), the others written.
  EXPECT_EQ(driver.version(url(1)), version1);
  EXPECT_EQ(driver.version(url(2)), version2);
  const std::map<std::string, std::string> resumed = MemoryOutput(root);
  ASSERT_EQ(resumed.size(), 6u);  // four data files, the index, the manifest

  driver.RemovePrefix(root + "/");
  absl::StatusOr<ConversionResult> uninterrupted = RunAnyConversion(spec, {});
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  EXPECT_EQ(uninterrupted->reused_files, 0);
  EXPECT_EQ(MemoryOutput(root), resumed);
}

// A finished mem:// output is refused without --overwrite, and replaced with it.
TEST(MemoryOutputTest, FinishedOutputIsRefusedWithoutOverwrite) {
  ConversionSpec spec = Consolidate(WriteModel(), "mem://outputs/finished/out");
  spec.max_shard_size = 70'000;
  ASSERT_TRUE(RunAnyConversion(spec, {}).ok());
  absl::StatusOr<ConversionResult> again = RunAnyConversion(spec, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(again.status().message().find("mem://outputs/finished/out is not empty"),
            absl::string_view::npos)
      << again.status();
  EXPECT_EQ(CheckOutputUsable(spec).code(), absl::StatusCode::kFailedPrecondition);
  spec.overwrite = true;
  absl::StatusOr<ConversionResult> replaced = RunAnyConversion(spec, {});
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->reused_files, 0);
}

// The plan of a consolidation of `input` into `output` with 20 MB shards, and the memory
// ShareConversionMemory accounts for: the execution with the planned window and spans and, into
// s3://, an open upload per thread of the first file's size with the planned writer budget (the
// parts in flight that fit, and the one filling). `local` is the estimate of the execution with
// the spec's window and spans.
struct S3Memory {
  PlannedConversion planned;
  uint64_t local = 0;
  uint64_t accounted = 0;
};
absl::StatusOr<S3Memory> PlanMemory(const std::string& input, const std::string& output,
                                    int threads = 2, DTypePolicy dtype = DTypePolicy::kKeep,
                                    uint64_t max_shard_size = 20'000'000) {
  ConversionSpec spec = Consolidate(input, output);
  spec.max_shard_size = max_shard_size;
  spec.dtype = dtype;
  spec.threads = threads;
  absl::StatusOr<PlannedConversion> planned = PlanConversion(spec);
  if (!planned.ok()) return planned.status();
  S3Memory memory;
  memory.planned = *std::move(planned);
  const CopyPlan& plan = memory.planned.plan;
  memory.local = EstimateExecutionMemory(plan, ExecutorOptionsFor(spec));
  ExecutorOptions shrunk = ExecutorOptionsFor(spec);
  shrunk.window_bytes = memory.planned.window_bytes;
  shrunk.remote_span_bytes = memory.planned.remote_span_bytes;
  memory.accounted = EstimateExecutionMemory(plan, shrunk);
  if (absl::StartsWith(output, "s3://")) {
    const uint64_t per_upload = S3ObjectWriter::MemoryBound(
        S3ObjectWriter::OptionsFor(plan.files[0].bytes, memory.planned.writer_budget));
    memory.accounted += std::min<uint64_t>(plan.files.size(), threads) * per_upload;
  }
  return memory;
}
absl::StatusOr<S3Memory> PlanS3Memory(int64_t rows, int64_t cols, int threads = 2) {
  return PlanMemory(WriteModel(rows, cols), "s3://models/out", threads);
}

// WriteModel(rows, cols) in the memory store (mem://, read by range requests as s3:// is).
std::string RemoteModel(const std::string& name, int64_t rows, int64_t cols) {
  const std::string path = absl::StrCat("mem://inputs/", name, "/model.safetensors");
  kvstore::GetMemoryDriver().Put(path, ReadAll(WriteModel(rows, cols)));
  return path;
}

// Plans a consolidation to bf16 of four 16 MiB fp32 tensors read by range requests
// (RemoteModel `name`) into `output`, one file each, whose window and spans of the spec are
// estimated above what kOutputMemoryCap leaves beside the process's own memory, and expects it
// planned within that, accounted exactly, with the window `window` and the spans `spans`
// (shared by the two workers). Converted, each tensor is read through spans (a tensor that
// keeps its dtype is read into the window: TensorFiller::GathersRemoteRuns).
void ExpectPlannedSplit(const std::string& name, const std::string& output, uint64_t window,
                        uint64_t spans) {
  absl::StatusOr<S3Memory> memory = PlanMemory(RemoteModel(name, 2048, 2048), output,
                                               /*threads=*/2, DTypePolicy::kBF16, 9'000'000);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ(memory->planned.plan.files.size(), 4u);
  ASSERT_GT(memory->local, kOutputMemoryCap - kProcessMemory);
  EXPECT_EQ(memory->planned.memory_bytes, memory->accounted);
  EXPECT_LE(memory->accounted, kOutputMemoryCap - kProcessMemory);
  EXPECT_EQ(memory->planned.window_bytes, window);
  EXPECT_EQ(memory->planned.remote_span_bytes, spans);
}

// A remote input's read spans share the budget the window comes from: into a folder, the
// window halves to 4 MiB and the spans keep 16 MiB.
TEST(ObjectStoreMemoryTest, RemoteInputSpansAndWindowShareTheBudget) {
  ExpectPlannedSplit("spans", MakeTempDir("spans") + "/out", 4u << 20, 16u << 20);
}

// Both ends remote: the window, the input's spans and the uploads' parts share one budget; the
// window halves to its least (1 MiB), then the spans to 2 MiB, where the uploads get the most.
TEST(ObjectStoreMemoryTest, RemoteInputAndOutputShareOneBudget) {
  ExpectPlannedSplit("both", "s3://models/out", 1u << 20, 2u << 20);
}

// A conversion into s3:// needs no more memory than the same conversion into a folder: the
// executor's window and the uploads' parts in flight share the window's budget.
TEST(ObjectStoreMemoryTest, WindowAndUploadBuffersFitTheBudget) {
  // Four 8 MiB fp32 tensors: two 16 MiB data files, written at once.
  absl::StatusOr<S3Memory> memory = PlanS3Memory(1024, 2048);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ(memory->planned.plan.files.size(), 2u);
  EXPECT_EQ(memory->planned.memory_bytes, memory->accounted);
  EXPECT_LE(memory->accounted, memory->local);
}

// The accounted memory of a conversion into s3:// (the executor's window and every open
// upload's parts) stays within what kOutputMemoryCap leaves beside the process's own memory,
// though the execution alone with the window of the spec is estimated above that.
TEST(ObjectStoreMemoryTest, AccountedMemoryStaysWithinTheCap) {
  // Four 16 MiB fp32 tensors: four 16 MiB data files, one written at a time.
  absl::StatusOr<S3Memory> memory = PlanS3Memory(2048, 2048, /*threads=*/1);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ(memory->planned.plan.files.size(), 4u);
  ASSERT_GT(memory->local, kOutputMemoryCap - kProcessMemory);
  EXPECT_EQ(memory->planned.memory_bytes, memory->accounted);
  EXPECT_LE(memory->accounted, kOutputMemoryCap - kProcessMemory);
}

// Two 16 MiB files written at once leave no room beyond the least in what the cap leaves
// beside the process's own memory: the smallest window (1 MiB), and each upload one part of
// S3's least size in flight and one filling.
TEST(ObjectStoreMemoryTest, TightBudgetTakesTheLeastWindowAndParts) {
  absl::StatusOr<S3Memory> memory = PlanS3Memory(2048, 2048);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ(memory->planned.plan.files.size(), 4u);
  EXPECT_EQ(memory->planned.window_bytes, 1u << 20);
  const S3ObjectWriter::Options upload = S3ObjectWriter::OptionsFor(
      memory->planned.plan.files[0].bytes, memory->planned.writer_budget);
  EXPECT_EQ(upload.part_bytes, S3Client::kMinPartBytes);
  EXPECT_EQ(upload.parts_in_flight, 1);
  EXPECT_EQ(memory->planned.memory_bytes, memory->accounted);
}

}  // namespace
}  // namespace reshard
