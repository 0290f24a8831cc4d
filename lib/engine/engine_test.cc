#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/verify.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/io/staging_dir.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;

struct TestTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::string data;  // dense row-major bytes
};

// The test model: random finite values, so float comparisons are meaningful.
std::vector<TestTensor> MakeModel(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TestTensor> tensors = {
      {"layers.0.attn.q_proj.weight", DType::kF32, {8, 6}, ""},
      {"layers.0.attn.o_proj.weight", DType::kF32, {6, 8}, ""},
      {"layers.0.mlp.up.weight", DType::kBF16, {12, 6}, ""},
      {"layers.0.norm.weight", DType::kF32, {6}, ""},
      {"embed.weight", DType::kF16, {10, 6}, ""},
      {"step", DType::kI64, {}, ""},
      {"mask", DType::kBool, {5}, ""},
  };
  for (TestTensor& t : tensors) {
    const int64_t n = NumElementsUnchecked(t.shape);
    for (int64_t i = 0; i < n; ++i) {
      if (t.dtype == DType::kF32) {
        float v = std::uniform_real_distribution<float>(-4, 4)(rng);
        t.data.append(reinterpret_cast<const char*>(&v), 4);
      } else if (t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
        // Finite 16-bit floats of moderate size (exponent field kept away from Inf/NaN).
        uint16_t bits = static_cast<uint16_t>((rng() & 0x83ff) | ((10 + rng() % 12) << 10));
        if (t.dtype == DType::kBF16)
          bits = static_cast<uint16_t>((rng() & 0x807f) | ((120 + rng() % 12) << 7));
        t.data.append(reinterpret_cast<const char*>(&bits), 2);
      } else if (t.dtype == DType::kI64) {
        int64_t v = static_cast<int64_t>(rng()) * 1000;
        t.data.append(reinterpret_cast<const char*>(&v), 8);
      } else {
        t.data.push_back(static_cast<char>(rng() & 1));
      }
    }
  }
  return tensors;
}

// Writes `tensors` as a safetensors file the way reshard's writer (and the reference writer)
// would: dtype descending, then name; `format: pt` metadata.
std::string WriteCanonical(const std::string& path, std::vector<TestTensor> tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TestTensor& a, const TestTensor& b) {
    if (a.dtype != b.dtype) return DTypeSortRank(a.dtype) > DTypeSortRank(b.dtype);
    return a.name < b.name;
  });
  std::vector<SafetensorsTensorEntry> entries;
  std::string data;
  for (const TestTensor& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, data.size(), data.size() + t.data.size()});
    data += t.data;
  }
  auto header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  EXPECT_TRUE(header.ok()) << header.status();
  const std::string file = *header + data;
  WriteAll(path, file);
  return file;
}

// Reads every tensor of the checkpoint at `path` (single model) as dense bytes.
std::map<std::string, std::pair<Shape, std::string>> ReadTensors(const std::string& path) {
  std::map<std::string, std::pair<Shape, std::string>> result;
  SafetensorsInput reader;
  auto model = reader.Read(path, {});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return result;
  EXPECT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  for (const CatalogTensor& tensor : catalog.tensors) {
    EXPECT_EQ(tensor.pieces.size(), 1u);
    const SourcePiece& piece = tensor.pieces[0];
    const std::string file = ReadAll(catalog.files[piece.file].path);
    result[tensor.name] = {tensor.shape, file.substr(piece.byte_offset, TensorBytes(tensor))};
  }
  return result;
}

std::string WriteRules(const std::string& dir) {
  const std::string path = dir + "/rules.json";
  WriteAll(path, R"({"rules": [
    {"pattern": "q_proj\\.weight$", "split_dim": 0},
    {"pattern": "o_proj\\.weight$", "split_dim": -1},
    {"pattern": "mlp\\.up\\.weight$", "split_dim": 0},
    {"pattern": ".*", "replicate": true}]})");
  return path;
}

class EngineTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("engine");
    model_ = MakeModel(seed_);
    input_ = root_ + "/model.safetensors";
    original_ = WriteCanonical(input_, model_);
    rules_ = WriteRules(root_);
  }

  ConversionSpec Consolidate(const std::string& input, const std::string& output) {
    ConversionSpec spec;
    spec.kind = ConversionSpec::Kind::kConsolidate;
    spec.input = input;
    spec.output = output;
    spec.window_bytes = 4096;
    return spec;
  }

  // A consolidation into `out` in several files, one thread, killed right after it recorded
  // its second data file (RunKilledAfter); returns its spec.
  ConversionSpec KilledAfterTwoFiles(const std::string& out);

  const uint32_t seed_ = 8675309;
  std::string root_, input_, original_, rules_;
  std::vector<TestTensor> model_;
};

TEST_F(EngineTest, ConsolidateIntoSeveralShards) {
  ConversionSpec spec = Consolidate(input_, root_ + "/out");
  spec.max_shard_size = 200;  // forces several files
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output, root_ + "/out");
  EXPECT_EQ(result->tensors, static_cast<int64_t>(model_.size()));
  EXPECT_FALSE(fs::exists(StagingPathFor(root_ + "/out")));

  // Files on disk: shards, the index, the manifest.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root_ + "/out")) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  int shards = 0;
  for (const std::string& name : names) {
    if (name.rfind("model-", 0) == 0) ++shards;
  }
  EXPECT_GE(shards, 3) << "max_shard_size 200 should give several files";
  EXPECT_NE(std::find(names.begin(), names.end(), kSafetensorsIndexName), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), kManifestName), names.end());
  EXPECT_EQ(names.size(), static_cast<size_t>(shards) + 2);

  // Every tensor's bytes equal the input's (default dtype policy keeps them).
  auto tensors = ReadTensors(root_ + "/out");
  ASSERT_EQ(tensors.size(), model_.size());
  for (const TestTensor& t : model_) {
    ASSERT_TRUE(tensors.count(t.name)) << t.name;
    EXPECT_EQ(tensors[t.name].first, t.shape) << t.name;
    EXPECT_TRUE(tensors[t.name].second == t.data) << t.name << " bytes differ";
  }

  // The manifest lists every data file and the index with sizes.
  auto manifest = nlohmann::json::parse(ReadAll(root_ + "/out/" + kManifestName));
  EXPECT_EQ(manifest["tool"], "reshard");
  std::vector<std::string> listed;
  for (const auto& file : manifest["files"]) {
    const std::string name = file["name"];
    listed.push_back(name);
    EXPECT_EQ(file["bytes"].get<uint64_t>(), fs::file_size(root_ + "/out/" + name)) << name;
    EXPECT_EQ(file["xxh3_64"].get<std::string>().size(), 16u);
  }
  std::sort(listed.begin(), listed.end());
  std::vector<std::string> expected_listed = names;
  expected_listed.erase(std::find(expected_listed.begin(), expected_listed.end(), kManifestName));
  EXPECT_EQ(listed, expected_listed);
  EXPECT_EQ(manifest["tensors"].size(), model_.size());
  EXPECT_EQ(manifest["request"]["kind"], "consolidate");
  EXPECT_EQ(manifest["request"]["max_shard_size"], 200);

  // And it verifies equal to the input.
  auto verify = VerifyCheckpoints(input_, root_ + "/out");
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_TRUE(verify->equal);
  EXPECT_EQ(verify->tensors_compared, static_cast<int64_t>(model_.size()));
}

TEST_F(EngineTest, ConsolidateSingleFileIsCanonical) {
  auto result = RunConversion(Consolidate(input_, root_ + "/single"));
  ASSERT_TRUE(result.ok()) << result.status();
  // The input was written in the writer's canonical form, so the copy is byte-identical.
  EXPECT_TRUE(ReadAll(root_ + "/single/model.safetensors") == original_);
  EXPECT_FALSE(fs::exists(root_ + "/single/" + std::string(kSafetensorsIndexName)));
}

TEST_F(EngineTest, ReshardToPartsAndBack) {
  ConversionSpec split;
  split.kind = ConversionSpec::Kind::kReshard;
  split.input = input_;
  split.output = root_ + "/parts";
  split.parts = 2;
  split.rules_file = rules_;
  split.window_bytes = 4096;
  auto parted = RunConversion(split);
  ASSERT_TRUE(parted.ok()) << parted.status();
  ASSERT_TRUE(fs::exists(root_ + "/parts/model_part-0.safetensors"));
  ASSERT_TRUE(fs::exists(root_ + "/parts/model_part-1.safetensors"));
  auto part1 = ReadTensors(root_ + "/parts/model_part-1.safetensors");
  // q_proj [8, 6] split on dim 0: part 1 holds rows 4..8, i.e. the second half of the bytes.
  const TestTensor& q = model_[0];
  EXPECT_EQ(part1["layers.0.attn.q_proj.weight"].first, (Shape{4, 6}));
  EXPECT_TRUE(part1["layers.0.attn.q_proj.weight"].second == q.data.substr(q.data.size() / 2));
  // o_proj [6, 8] split on the last dim: part 1 holds columns 4..8 of every row.
  const TestTensor& o = model_[1];
  std::string o_right;
  for (int r = 0; r < 6; ++r) o_right += o.data.substr((r * 8 + 4) * 4, 16);
  EXPECT_EQ(part1["layers.0.attn.o_proj.weight"].first, (Shape{6, 4}));
  EXPECT_TRUE(part1["layers.0.attn.o_proj.weight"].second == o_right);
  EXPECT_TRUE(part1["step"].second == model_[5].data);  // replicated

  ConversionSpec merge = Consolidate(root_ + "/parts", root_ + "/merged");
  merge.rules_file = rules_;
  auto merged = RunConversion(merge);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE(ReadAll(root_ + "/merged/model.safetensors") == original_)
      << "1 -> 2 parts -> 1 must reproduce the original file byte for byte";

  // Without rules the parts cannot be merged.
  auto no_rules = RunConversion(Consolidate(root_ + "/parts", root_ + "/merged2"));
  ASSERT_FALSE(no_rules.ok());
  EXPECT_NE(no_rules.status().message().find("--rules"), absl::string_view::npos)
      << no_rules.status();
  EXPECT_FALSE(fs::exists(root_ + "/merged2"));

  VerifyOptions options;
  options.rules_a = rules_;
  auto verify = VerifyCheckpoints(root_ + "/parts", input_, options);
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_TRUE(verify->equal);
}

TEST_F(EngineTest, DTypeConversionVerifiesAgainstOriginal) {
  ConversionSpec spec = Consolidate(input_, root_ + "/bf16");
  spec.dtype = DTypePolicy::kBF16;
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  SafetensorsInput reader;
  auto model = reader.Read(root_ + "/bf16/model.safetensors", {});
  ASSERT_TRUE(model.ok());
  const Catalog& catalog = model->parts[0];
  EXPECT_EQ(catalog.tensors[catalog.Find("layers.0.norm.weight")].dtype, DType::kBF16);
  EXPECT_EQ(catalog.tensors[catalog.Find("embed.weight")].dtype, DType::kBF16);
  EXPECT_EQ(catalog.tensors[catalog.Find("step")].dtype, DType::kI64);
  auto verify = VerifyCheckpoints(input_, root_ + "/bf16");
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_TRUE(verify->equal) << (verify->mismatched.empty() ? "" : verify->mismatched[0].name);
}

TEST_F(EngineTest, VerifyReportsFlippedElement) {
  auto same = VerifyCheckpoints(input_, input_);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->equal);
  EXPECT_FALSE(same->tolerance.empty());

  // Flip one bit of element 13 of the q_proj tensor in a copy.
  auto tensors = ReadTensors(input_);
  const std::string copy = root_ + "/flipped.safetensors";
  std::string bytes = original_;
  SafetensorsInput reader;
  auto model = reader.Read(input_, {});
  ASSERT_TRUE(model.ok());
  const Catalog& catalog = model->parts[0];
  const CatalogTensor& q = catalog.tensors[catalog.Find("layers.0.attn.q_proj.weight")];
  bytes[q.pieces[0].byte_offset + 13 * 4 + 1] ^= 0x10;
  WriteAll(copy, bytes);
  auto verify = VerifyCheckpoints(input_, copy);
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_FALSE(verify->equal);
  ASSERT_EQ(verify->mismatched.size(), 1u);
  const TensorMismatch& m = verify->mismatched[0];
  EXPECT_EQ(m.name, "layers.0.attn.q_proj.weight");
  EXPECT_EQ(m.first_index, 13);
  EXPECT_EQ(m.mismatches, 1);
  EXPECT_NE(m.a_value, m.b_value);
  EXPECT_TRUE(verify->only_in_a.empty());
  EXPECT_TRUE(verify->only_in_b.empty());
}

TEST_F(EngineTest, NonEmptyOutputIsRefusedAndUntouched) {
  const std::string out = root_ + "/busy";
  fs::create_directory(out);
  WriteAll(out + "/keep.txt", "precious");
  auto result = RunConversion(Consolidate(input_, out));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(out)) names.push_back(entry.path().filename());
  EXPECT_EQ(names, (std::vector<std::string>{"keep.txt"}));
  EXPECT_EQ(ReadAll(out + "/keep.txt"), "precious");
  EXPECT_FALSE(fs::exists(StagingPathFor(out)));
}

TEST_F(EngineTest, CancelledLeavesNothing) {
  const std::string out = root_ + "/cancelled";
  std::atomic<bool> cancelled{true};
  RunControl control;
  control.cancelled = &cancelled;
  ConversionSpec spec = Consolidate(input_, out);
  spec.max_shard_size = 200;
  auto result = RunConversion(spec, control);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(StagingPathFor(out)));
  for (const auto& entry : fs::directory_iterator(root_)) {
    EXPECT_EQ(entry.path().filename().string().find("reshard-staging"), std::string::npos)
        << entry.path();
  }
}

// name -> contents of every file below `dir`, the manifest without its timestamp.
std::map<std::string, std::string> OutputFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(entry.path(), dir).string();
    files[name] = entry.is_regular_file() ? ReadAll(entry.path().string()) : "(folder)";
  }
  if (files.count(kManifestName) > 0) {
    nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(files[kManifestName]);
    manifest.erase("created_unix");
    files[kManifestName] = manifest.dump();
  }
  return files;
}

// Runs `spec` in a child process that is killed (SIGKILL) right after it recorded its
// `files`-th data file, as a kill would stop reshardctl there.
void RunKilledAfter(const ConversionSpec& spec, int files) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int recorded = 0;
    RunControl control;
    control.on_file_committed = [&recorded, files](const WrittenFile&) {
      if (++recorded == files) ::raise(SIGKILL);
    };
    RunConversion(spec, control).IgnoreError();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

ConversionSpec EngineTest::KilledAfterTwoFiles(const std::string& out) {
  ConversionSpec spec = Consolidate(input_, out);
  spec.max_shard_size = 200;
  spec.threads = 1;
  RunKilledAfter(spec, 2);
  return spec;
}

uint64_t InodeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_ino);
}

// Data file -> inode, of the data files in folder `dir`.
std::map<std::string, uint64_t> DataFilesIn(const std::string& dir) {
  std::map<std::string, uint64_t> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.rfind("model-", 0) == 0) {
      files[name] = InodeOf(entry.path().string());
    }
  }
  return files;
}

// The lines of the staging folder's record log, in order.
std::vector<std::string> LogLines(const std::string& staging) {
  return absl::StrSplit(ReadAll(absl::StrCat(staging, "/", kFileRecordLogName)), '\n',
                        absl::SkipEmpty());
}

// The names of the files in the staging folder's records folder.
std::set<std::string> RecordFolderFiles(const std::string& staging) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(staging + "/.reshard-progress")) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// A conversion killed (SIGKILL) right after it recorded its second data file, then rerun as
// reshardctl reruns it (no daemon, not resuming a job): the rerun keeps exactly those two files
// from the staging folder (the same inodes are published) and publishes what an uninterrupted
// run publishes, with nothing of the records left. The records are two lines of one file, in
// the order the files were finished: no file is created per data file.
TEST_F(EngineTest, RerunAfterAKillReusesTheRecordedFiles) {
  const std::string out = root_ + "/out";
  const std::string staging = StagingPathFor(out);
  const ConversionSpec spec = KilledAfterTwoFiles(out);
  if (HasFatalFailure()) return;
  EXPECT_FALSE(fs::exists(out));
  const std::map<std::string, uint64_t> finished = DataFilesIn(staging);
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(RecordFolderFiles(staging), std::set<std::string>{"records.jsonl"});
  std::vector<std::string> logged;
  for (const std::string& line : LogLines(staging)) {
    const std::optional<FileRecord> record = ParseFileRecord(line);
    ASSERT_TRUE(record.has_value()) << line;
    logged.push_back(record->name);
  }
  // One worker finishes the files in the order of their names.
  std::vector<std::string> names;
  for (const auto& [name, inode] : finished) names.push_back(name);
  EXPECT_EQ(logged, names);

  auto rerun = RunConversion(spec);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->verification_failures, 0);
  EXPECT_FALSE(fs::exists(staging));
  for (const auto& [name, inode] : finished) EXPECT_EQ(InodeOf(out + "/" + name), inode) << name;
  const std::map<std::string, std::string> resumed = OutputFiles(out);

  fs::remove_all(out);
  auto uninterrupted = RunConversion(spec);
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  EXPECT_EQ(uninterrupted->reused_files, 0);
  EXPECT_EQ(OutputFiles(out), resumed);
}

// A staging folder whose records are files of their own (`.reshard-progress/<file>.json`, as
// partitioned runs and object stores write them) is taken over as one with the log: the rerun
// keeps the recorded files (the same inodes are published).
TEST_F(EngineTest, RerunTakesOverRecordsThatAreFilesOfTheirOwn) {
  const std::string out = root_ + "/out";
  const std::string staging = StagingPathFor(out);
  const ConversionSpec spec = KilledAfterTwoFiles(out);
  if (HasFatalFailure()) return;
  const std::map<std::string, uint64_t> finished = DataFilesIn(staging);
  ASSERT_EQ(finished.size(), 2u);
  for (const std::string& line : LogLines(staging)) {
    const std::optional<FileRecord> record = ParseFileRecord(line);
    ASSERT_TRUE(record.has_value()) << line;
    WriteAll(absl::StrCat(staging, "/", FileRecordName(record->name)), FileRecordJson(*record));
  }
  fs::remove(absl::StrCat(staging, "/", kFileRecordLogName));
  ASSERT_EQ(RecordFolderFiles(staging).size(), 2u);

  auto rerun = RunConversion(spec);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->verification_failures, 0);
  for (const auto& [name, inode] : finished) EXPECT_EQ(InodeOf(out + "/" + name), inode) << name;
}

// What a crash of the machine can leave of records, which are not fsynced (output_commit.h,
// "Durability"): after a kill right after the fourth data file was recorded, one line of the
// log is zeros, one cut short, one names another size and one another XXH3-64 than its file's.
// The rerun succeeds, keeps none of the four files (each is written again: another inode), counts
// the one whose hash it checked and found different, and publishes what an uninterrupted run
// does.
TEST_F(EngineTest, RerunRewritesTheFilesOfTornRecords) {
  const std::string out = root_ + "/out";
  const std::string staging = StagingPathFor(out);
  ConversionSpec spec = Consolidate(input_, out);
  spec.max_shard_size = 200;
  spec.threads = 1;
  RunKilledAfter(spec, 4);
  if (HasFatalFailure()) return;
  const std::map<std::string, uint64_t> finished = DataFilesIn(staging);
  ASSERT_EQ(finished.size(), 4u);
  // Links that keep the killed run's files, so that a file written again cannot get a freed
  // inode back.
  fs::create_directory(root_ + "/killed");
  for (const auto& [name, inode] : finished) {
    fs::create_hard_link(staging + "/" + name, root_ + "/killed/" + name);
  }
  std::vector<std::string> lines = LogLines(staging);
  ASSERT_EQ(lines.size(), 4u);
  lines[0] = std::string(lines[0].size(), '\0');
  lines[1] = lines[1].substr(0, lines[1].size() / 2);
  nlohmann::ordered_json record = nlohmann::ordered_json::parse(lines[2]);
  record["bytes"] = record["bytes"].get<uint64_t>() + 1;
  lines[2] = record.dump();
  record = nlohmann::ordered_json::parse(lines[3]);
  record["xxh3_64"] = record["xxh3_64"].get<std::string>() == "0000000000000000"
                          ? "0000000000000001"
                          : "0000000000000000";
  lines[3] = record.dump();
  WriteAll(absl::StrCat(staging, "/", kFileRecordLogName), absl::StrJoin(lines, "\n") + "\n");

  auto rerun = RunConversion(spec);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->reused_files, 0);
  EXPECT_EQ(rerun->verification_failures, 1);
  for (const auto& [name, inode] : finished) EXPECT_NE(InodeOf(out + "/" + name), inode) << name;
  const std::map<std::string, std::string> rerun_files = OutputFiles(out);
  fs::remove_all(out);
  ASSERT_TRUE(RunConversion(spec).ok());
  EXPECT_EQ(OutputFiles(out), rerun_files);
}

// A stale staging folder of another request (here another shard size) is taken over and
// emptied: none of its files is reused or published.
TEST_F(EngineTest, StaleStagingOfAnotherPlanIsNotReused) {
  const std::string out = root_ + "/out";
  ConversionSpec spec = KilledAfterTwoFiles(out);
  if (HasFatalFailure()) return;
  WriteAll(StagingPathFor(out) + "/stray.bin", "not the output's");
  spec.max_shard_size = 300;
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->reused_files, 0);
  const std::map<std::string, std::string> published = OutputFiles(out);
  fs::remove_all(out);
  ASSERT_TRUE(RunConversion(spec).ok());
  EXPECT_EQ(OutputFiles(out), published);
}

TEST_F(EngineTest, CorruptInputFailsBeforeWriting) {
  const std::string bad = root_ + "/bad.safetensors";
  WriteAll(bad, original_.substr(0, original_.size() - 3));
  auto result = RunConversion(Consolidate(bad, root_ + "/never"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_NE(result.status().message().find("bad.safetensors"), absl::string_view::npos);
  EXPECT_FALSE(fs::exists(root_ + "/never"));
}

// A daemon job killed after publishing but before recording success is resumed: its own
// output (manifest naming the job and request, files matching) is its result, not "not empty".
TEST_F(EngineTest, ResumedJobRecognizesItsOwnPublishedOutput) {
  const std::string out = root_ + "/published";
  ConversionSpec spec = Consolidate(input_, out);
  spec.max_shard_size = 200;
  RunControl first;
  first.job_id = "j-00000000000000aa";
  auto written = RunConversion(spec, first);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_NE(ReadAll(out + "/" + kManifestName).find("\"job_id\": \"j-00000000000000aa\""),
            std::string::npos);

  RunControl resumed = first;
  resumed.resume = true;
  auto again = RunConversion(spec, resumed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->found_published);
  ASSERT_EQ(again->files.size(), written->files.size());
  for (size_t i = 0; i < written->files.size(); ++i) {
    EXPECT_EQ(again->files[i].name, written->files[i].name);
    EXPECT_EQ(again->files[i].xxh3_64, written->files[i].xxh3_64);
  }
  EXPECT_EQ(again->bytes_written, written->bytes_written);
  EXPECT_EQ(again->tensors, written->tensors);

  // Another job, or the same job with another request, still finds the folder taken.
  RunControl other = resumed;
  other.job_id = "j-00000000000000bb";
  EXPECT_EQ(RunConversion(spec, other).status().code(), absl::StatusCode::kFailedPrecondition);
  ConversionSpec changed = spec;
  changed.dtype = DTypePolicy::kBF16;
  EXPECT_EQ(RunConversion(changed, resumed).status().code(), absl::StatusCode::kFailedPrecondition);
  // Not resuming: refused as before.
  EXPECT_EQ(RunConversion(spec, first).status().code(), absl::StatusCode::kFailedPrecondition);

  // A published file changed afterwards is not taken for the job's output.
  const std::string victim = out + "/" + written->files[0].name;
  std::string data = ReadAll(victim);
  data[data.size() / 2] ^= 1;
  WriteAll(victim, data);
  auto damaged = RunConversion(spec, resumed);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find(written->files[0].name), absl::string_view::npos);
}

TEST_F(EngineTest, RemotePathsAreRefusedNotWrittenLocally) {
  auto result = RunConversion(Consolidate(input_, "s3://bucket/out"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find("s3://bucket/out"), absl::string_view::npos);
  EXPECT_FALSE(fs::exists("s3:"));
  // s3:// inputs are read through the "s3" store: without credentials in the test's
  // environment the run fails before it reads or writes anything. A scheme without a store
  // is Unimplemented.
  auto s3_input = RunConversion(Consolidate("s3://bucket/in", root_ + "/x"));
  EXPECT_FALSE(s3_input.ok());
  EXPECT_NE(s3_input.status().message().find("s3://bucket/in"), absl::string_view::npos)
      << s3_input.status();
  EXPECT_FALSE(fs::exists(root_ + "/x"));
  EXPECT_EQ(PlanConversion(Consolidate("gs://bucket/in", root_ + "/x")).status().code(),
            absl::StatusCode::kUnimplemented);
}

// The plan of an s3:// output counts the upload parts each data file written at once holds
// (S3ObjectWriter) within the memory a local output of the same conversion would use
// (ShareConversionMemory); a model this small leaves the writers no room beyond that, so each
// holds its least: one part in flight and the one filling, of S3's least part size (5 MiB).
TEST_F(EngineTest, PlanOfAnObjectStoreOutputCountsTheUploads) {
  auto local = PlanConversion(Consolidate(input_, root_ + "/out"));
  ASSERT_TRUE(local.ok()) << local.status();
  auto remote = PlanConversion(Consolidate(input_, "s3://bucket/out"));
  ASSERT_TRUE(remote.ok()) << remote.status();
  const uint64_t files_at_once = std::min<uint64_t>(2, remote->plan.files.size());
  EXPECT_EQ(remote->memory_bytes - local->memory_bytes, files_at_once * 2 * (5ull << 20));
}

}  // namespace
}  // namespace reshard
