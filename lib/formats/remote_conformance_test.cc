// The format conformance fixtures (lib/formats/format_fixture.h) read from remote storage: each
// fixture's folder is uploaded to the memory kvstore driver (lib/io/kvstore/memory_driver.h,
// standing in for S3) and, for every format:
//
//   1. detection picks that format, and the reader gives the same InputModel as for the local
//      copy (files, sizes, checksummed ranges, tensors, pieces, training state), in a bounded
//      number of requests (printed: "remote metadata: <fixture>: R range reads, L lookups");
//   2. a conversion from the remote copy writes the same bytes as one from the local copy;
//   3. the damaged variants fail as locally (DATA_LOSS, INVALID_ARGUMENT, NOT_FOUND for a
//      missing file), and the error names the remote path.

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/conversion.h"
#include "lib/formats/format.h"
#include "lib/formats/format_fixture.h"
#include "lib/exec/executor.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using FixtureKey = std::pair<std::string, std::string>;

std::vector<FixtureKey> FixtureKeys() {
  std::vector<FixtureKey> keys;
  for (const auto& [key, fixture] : FormatFixtures()) keys.push_back(key);
  return keys;
}

kvstore::MemoryDriver* Store() { return &kvstore::GetMemoryDriver(); }

// Uploads every file under local folder `dir` as `url`/<relative path>.
void Upload(const std::string& dir, const std::string& url) {
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string relative = fs::relative(entry.path(), dir).string();
    Store()->Put(absl::StrCat(url, "/", relative), ReadAll(entry.path().string()));
  }
}

std::string Join(const std::vector<int64_t>& values) { return absl::StrJoin(values, ","); }

void DescribePieces(const std::vector<SourcePiece>& pieces, std::string& out) {
  for (const SourcePiece& piece : pieces) {
    absl::StrAppend(&out, "  piece file ", piece.file, " @", piece.byte_offset, " box [",
                    Join(piece.box.origin), "]+[", Join(piece.box.extent), "] strides [",
                    Join(piece.strides), "]\n");
  }
}

void DescribeFiles(const std::vector<SourceFile>& files, std::string& out) {
  for (const SourceFile& file : files) {
    absl::StrAppend(&out, "file ", file.path, " ", file.size, " bytes\n");
    for (const ChecksummedRange& range : file.checksummed) {
      absl::StrAppend(&out, "  crc ", range.offset, "+", range.length, " ", range.crc32, " ",
                      range.name, "\n");
    }
  }
}

void DescribeTensors(const std::vector<CatalogTensor>& tensors, std::string& out) {
  for (const CatalogTensor& tensor : tensors) {
    absl::StrAppend(&out, "tensor ", tensor.name, " ", DTypeName(tensor.dtype), " [",
                    Join(tensor.shape), "]\n");
    DescribePieces(tensor.pieces, out);
    if (!tensor.replicas.empty()) absl::StrAppend(&out, " replicas\n");
    DescribePieces(tensor.replicas, out);
  }
}

// Everything a reader gives, with `root` (the folder's local path or URL) written as <root>.
std::string Describe(const InputModel& model, const std::string& root) {
  std::string out = absl::StrCat("format ", model.format, "\narrangement ", model.arrangement,
                                 "\ndescription ", model.description, "\n");
  for (size_t p = 0; p < model.parts.size(); ++p) {
    const Catalog& part = model.parts[p];
    absl::StrAppend(&out, "part ", p, " ", p < model.part_names.size() ? model.part_names[p] : "",
                    "\n");
    DescribeFiles(part.files, out);
    DescribeTensors(part.tensors, out);
    for (const auto& [key, value] : part.metadata) absl::StrAppend(&out, "meta ", key, "\n");
    absl::StrAppend(&out, "other ", absl::StrJoin(part.other_entries, ","), "\n");
  }
  const TrainingState& state = model.training_state;
  for (const auto& [name, value] : state.values) absl::StrAppend(&out, "state ", name, "\n");
  DescribeFiles(state.files, out);
  DescribeTensors(state.tensors, out);
  absl::StrAppend(&out, "verbatim ", absl::StrJoin(state.verbatim_files, ","), "\nproblem ",
                  state.problem.ToString(), "\n");
  return absl::StrReplaceAll(out, {{root, "<root>"}});
}

class RemoteConformanceTest : public ::testing::TestWithParam<FixtureKey> {
 protected:
  void SetUp() override {
    format_ = GetParam().first;
    label_ = GetParam().second.empty() ? format_ : absl::StrCat(format_, "/", GetParam().second);
    tag_ = absl::StrReplaceAll(label_, {{"/", "_"}});
    dir_ = MakeTempDir(absl::StrCat("remote_fixture_", tag_));
    fixture_ = FormatFixtures().at(GetParam()).builder(dir_);
    ASSERT_FALSE(fixture_.input.empty()) << "the fixture " << label_ << " was not built";
    url_ = absl::StrCat("mem://b/", tag_);
    Store()->RemovePrefix(url_ + "/");
    Upload(dir_, url_);
    remote_input_ = url_ + fixture_.input.substr(dir_.size());
    absl::StatusOr<const InputFormat*> local = DetectInputFormat(fixture_.input);
    ASSERT_TRUE(local.ok()) << local.status();
    format_impl_ = *local;
  }

  std::string format_, label_, tag_, dir_, url_, remote_input_;
  BuiltFixture fixture_;
  const InputFormat* format_impl_ = nullptr;
};

ConversionSpec Spec(const std::string& input, const std::string& output) {
  ConversionSpec spec;
  spec.kind = ConversionSpec::Kind::kConsolidate;
  spec.input = input;
  spec.output = output;
  spec.output_format = "safetensors";
  spec.threads = 1;
  return spec;
}

// Every file of output folder `dir` but the manifest (which names the input), by name.
std::map<std::string, std::string> OutputFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "reshard-manifest.json") continue;
    files[name] = ReadAll(entry.path().string());
  }
  return files;
}

// Fixtures whose remote copy is refused on purpose: fixture -> what the refusal says. The
// megatron fixture has no args, and without them a rank missing from object storage cannot be
// noticed (megatron_lm_reader.cc).
const std::map<std::string, std::string>& RefusedRemotely() {
  static const auto* fixtures = new std::map<std::string, std::string>{
      {"megatron", "the TP x PP size cannot be taken from the folder names"}};
  return *fixtures;
}

TEST_P(RemoteConformanceTest, ReadsAsTheLocalCopy) {
  absl::StatusOr<const InputFormat*> detected = DetectInputFormat(remote_input_);
  ASSERT_TRUE(detected.ok()) << detected.status();
  ASSERT_EQ((*detected)->id(), format_);
  const int reads = Store()->reads();
  const int lookups = Store()->lookups();
  absl::StatusOr<InputModel> remote = format_impl_->Read(remote_input_, ReadOptions());
  if (auto refused = RefusedRemotely().find(label_); refused != RefusedRemotely().end()) {
    ASSERT_TRUE(absl::IsInvalidArgument(remote.status())) << remote.status();
    EXPECT_THAT(remote.status().message(), HasSubstr(refused->second));
    EXPECT_THAT(remote.status().message(), HasSubstr(url_));
    std::fprintf(stderr, "remote metadata: %s: refused (%s)\n", label_.c_str(),
                 refused->second.c_str());
    return;
  }
  ASSERT_TRUE(remote.ok()) << remote.status();
  const int model_reads = Store()->reads() - reads;
  const int model_lookups = Store()->lookups() - lookups;
  absl::StatusOr<InputModel> local = format_impl_->Read(fixture_.input, ReadOptions());
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(Describe(*remote, url_), Describe(*local, dir_));
  for (const Catalog& part : remote->parts) {
    for (const SourceFile& file : part.files) {
      EXPECT_THAT(file.path, ::testing::StartsWith(url_ + "/"));
    }
  }
  // A few requests per file of the fixture (whatever its tensor count).
  int files = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir_)) {
    files += entry.is_regular_file() ? 1 : 0;
  }
  EXPECT_LE(model_reads, 4 * files) << label_;
  std::fprintf(stderr, "remote metadata: %s: %d range reads, %d lookups (%d files)\n",
               label_.c_str(), model_reads, model_lookups, files);
}

TEST_P(RemoteConformanceTest, ConvertsAsTheLocalCopy) {
  if (RefusedRemotely().count(label_) > 0) GTEST_SKIP() << label_ << " is refused remotely";
  const std::string out = MakeTempDir(absl::StrCat("remote_out_", tag_));
  absl::StatusOr<ConversionResult> remote = RunConversion(Spec(remote_input_, out + "/remote"));
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::StatusOr<ConversionResult> local = RunConversion(Spec(fixture_.input, out + "/local"));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(remote->tensors, local->tensors);
  const std::map<std::string, std::string> a = OutputFiles(out + "/remote");
  const std::map<std::string, std::string> b = OutputFiles(out + "/local");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : b) {
    ASSERT_EQ(a.count(name), 1u) << name;
    EXPECT_TRUE(a.at(name) == bytes) << name << " differs";
  }
}

// The damaged bytes of `damage` applied to the uploaded copy.
void DamageRemote(const std::string& url, const std::string& local_dir,
                  const FixtureDamage& damage) {
  const std::string object = absl::StrCat(url, "/", damage.file);
  std::string bytes = ReadAll(absl::StrCat(local_dir, "/", damage.file));
  switch (damage.kind) {
    case FixtureDamage::Kind::kTruncate:
      bytes.resize(damage.offset);
      break;
    case FixtureDamage::Kind::kFlip:
      bytes[damage.offset] ^= 0x01;
      break;
    case FixtureDamage::Kind::kRemove:
      Store()->RemovePrefix(object);
      return;
    case FixtureDamage::Kind::kReplace:
      bytes = damage.replacement;
      break;
  }
  Store()->Put(object, std::move(bytes));
}

TEST_P(RemoteConformanceTest, DamagedObjectsAreRefusedNamingThem) {
  if (RefusedRemotely().count(label_) > 0) GTEST_SKIP() << label_ << " is refused remotely";
  int n = 0;
  for (const FixtureDamage& damage : fixture_.damages) {
    if (damage.undetectable) continue;
    SCOPED_TRACE(damage.label);
    const std::string url = absl::StrCat(url_, "_damaged", n++);
    Store()->RemovePrefix(url + "/");
    Upload(dir_, url);
    DamageRemote(url, dir_, damage);
    const std::string input = url + fixture_.input.substr(dir_.size());
    const std::string out = MakeTempDir(absl::StrCat("remote_damaged_", tag_)) + "/out";
    absl::Status status;
    absl::StatusOr<LoadedInput> loaded = LoadInput(input, {}, /*require_model=*/true);
    status = loaded.status();
    if (status.ok()) status = RunConversion(Spec(input, out)).status();
    ASSERT_FALSE(status.ok()) << "the damaged input was accepted";
    const absl::StatusCode code = status.code();
    if (damage.in_checksummed_data) {
      EXPECT_EQ(code, absl::StatusCode::kDataLoss) << status;
    } else {
      const bool missing = damage.kind == FixtureDamage::Kind::kRemove || damage.names_missing_file;
      EXPECT_TRUE(code == absl::StatusCode::kDataLoss ||
                  code == absl::StatusCode::kInvalidArgument ||
                  (missing && code == absl::StatusCode::kNotFound))
          << status;
    }
    EXPECT_THAT(status.message(), HasSubstr(url)) << status;
  }
}

// An object replaced by another of the same size between the metadata read (planning) and the
// data read (the executor) is refused naming it and both versions: the pieces located in the
// old version would be read from the new one's bytes. Every source the plan reads (data files
// and the verbatim files some formats copy) is replaced in turn, last first, so that the
// executor, which opens the sources in order, meets each replaced one while the ones before it
// are intact.
TEST_P(RemoteConformanceTest, ObjectReplacedSinceItsMetadataIsRefused) {
  if (RefusedRemotely().count(label_) > 0) GTEST_SKIP() << label_ << " is refused remotely";
  const std::string out = MakeTempDir(absl::StrCat("remote_replaced_", tag_));
  absl::StatusOr<PlannedConversion> planned = PlanConversion(Spec(remote_input_, out + "/x"));
  ASSERT_TRUE(planned.ok()) << planned.status();
  const std::vector<SourceFile>& sources = planned->plan.sources;
  ASSERT_FALSE(sources.empty());
  absl::StatusOr<Directory> dir = OpenFolderCreating(out + "/staging");
  ASSERT_TRUE(dir.ok()) << dir.status();
  // Sources may name one object more than once (the parts of a NeMo archive are ranges of
  // it): each object is replaced once.
  std::set<std::string> replaced;
  for (size_t s = sources.size(); s-- > 0;) {
    const SourceFile& source = sources[s];
    if (!replaced.insert(source.path).second) continue;
    SCOPED_TRACE(source.path);
    const std::string then = Store()->version(source.path);
    ASSERT_EQ(source.version, then);
    std::string bytes = ReadAll(absl::StrCat(dir_, source.path.substr(url_.size())));
    ASSERT_EQ(bytes.size(), source.size);
    ASSERT_FALSE(bytes.empty());
    bytes.back() ^= 0x01;
    Store()->Put(source.path, std::move(bytes));
    const std::string now = Store()->version(source.path);
    ASSERT_NE(now, then);
    absl::StatusOr<ExecutionResult> executed =
        Execute(planned->plan, *dir, ExecutorOptionsFor(Spec(remote_input_, out + "/x")));
    ASSERT_EQ(executed.status().code(), absl::StatusCode::kFailedPrecondition)
        << executed.status();
    EXPECT_EQ(executed.status().message(),
              absl::StrCat(source.path, " changed since its metadata was read: ETag ", then,
                           " then, ", now, " now"));
  }
}

std::string TestName(const ::testing::TestParamInfo<FixtureKey>& info) {
  return FixtureTestName(info.param);
}

INSTANTIATE_TEST_SUITE_P(RegisteredInputFormats, RemoteConformanceTest,
                         ::testing::ValuesIn(FixtureKeys()), TestName);

}  // namespace
}  // namespace reshard
