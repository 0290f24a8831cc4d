// Tests of the CRC-32 check of torch.save storage records during a conversion: archives built
// byte by byte (lib/testing/zip_builder.h) with one byte of a record flipped, or a wrong CRC-32
// in the central directory, are converted through TorchArchive, the planner and the Executor,
// which must fail with DataLoss naming the file, the zip entry and a tensor read from it, while
// the intact archive converts with nothing read twice.

#include <zlib.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/exec/executor.h"
#include "lib/io/crc32_source.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/plan/planner.h"
#include "lib/testing/test_files.h"
#include "lib/testing/zip_builder.h"

namespace reshard {
namespace {

using zip_testing::BuildZip;
using zip_testing::Built;
using zip_testing::Entry;

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 48;
constexpr int64_t kTail = 100;  // elements of storage 0 after the ones "w" views

std::string F32s(int64_t n, float start) {
  std::string out(4 * n, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + 0.5f * static_cast<float>(i);
    std::memcpy(&out[4 * i], &v, 4);
  }
  return out;
}

// A torch.save archive holding
//   "w": [kRows, kCols] F32 viewing the first kRows * kCols elements of storage 0, which has
//        kTail more (the tensor covers only part of its record);
//   "b": [10] F32, the whole of storage 1;
//   "t": [6, 4] F32 with strides [1, 6], a transposed view of storage 2.
struct TorchFixture {
  std::vector<Entry> entries;
  Built built;

  uint64_t Payload(const std::string& key) const {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name == "archive/data/" + key) return built.payload[i];
    }
    ADD_FAILURE() << "no storage " << key;
    return 0;
  }
};

// `crc_of_b`, when set, is written as storage 1's CRC-32 in place of the real one.
TorchFixture MakeArchive(std::optional<uint32_t> crc_of_b = std::nullopt) {
  PickleWriter w;
  w.BeginDict(true);
  w.String("w");
  w.Tensor("FloatStorage", "0", kRows * kCols + kTail, {kRows, kCols}, {kCols, 1});
  w.String("b");
  w.Tensor("FloatStorage", "1", 10, {10}, {1});
  w.String("t");
  w.Tensor("FloatStorage", "2", 24, {6, 4}, {1, 6});
  w.EndDict();
  TorchFixture fixture;
  fixture.entries = {{"archive/data.pkl", w.Finish()},
                     {"archive/byteorder", "little"},
                     {"archive/data/0", F32s(kRows * kCols + kTail, 1)},
                     {"archive/data/1", F32s(10, -7)},
                     {"archive/data/2", F32s(24, 100)},
                     {"archive/version", "3\n"}};
  fixture.entries[3].crc32 = crc_of_b;
  fixture.built = BuildZip(fixture.entries);
  return fixture;
}

// Writes `bytes` to a new file, with the byte at `flip` (if any) inverted.
std::string WriteSource(const std::string& bytes, std::optional<uint64_t> flip = std::nullopt) {
  const std::string path = MakeTempDir("src") + "/model.pt";
  std::string data = bytes;
  if (flip.has_value()) data[*flip] = static_cast<char>(~data[*flip]);
  WriteAll(path, data);
  return path;
}

// The catalog of the archive at `path` with its tensors `names`.
Catalog CatalogOf(const std::string& path,
                  const std::vector<std::string>& names = {"w", "b", "t"}) {
  Catalog catalog;
  auto archive = TorchArchive::Open(path);
  EXPECT_TRUE(archive.ok()) << archive.status();
  if (!archive.ok()) return catalog;
  catalog.format = "torch";
  catalog.files.push_back((*archive)->Source());
  for (const std::string& name : names) {
    auto location = (*archive)->Tensor(PickleField((*archive)->root(), name), name);
    EXPECT_TRUE(location.ok() && location->has_value()) << name;
    catalog.tensors.push_back(CatalogTensorAt(name, **location, 0));
  }
  catalog.Reindex();
  EXPECT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  return catalog;
}

// One output file of the layout: (tensor name, region, dtype) in order.
struct OutTensor {
  std::string tensor;
  Box region;
  DType dtype = DType::kF32;
};
using OutFiles = std::map<std::string, std::vector<OutTensor>>;

absl::StatusOr<ExecutionResult> Convert(const std::string& source, const OutFiles& files,
                                        ExecutorOptions options, std::string out = "",
                                        const std::vector<std::string>& names = {"w", "b", "t"}) {
  const Catalog catalog = CatalogOf(source, names);
  TargetLayout layout;
  std::vector<FileFraming> framings;
  for (const auto& [name, tensors] : files) {
    OutputFileLayout file;
    file.name = name;
    FileFraming framing;
    for (const OutTensor& t : tensors) {
      const int index = catalog.Find(t.tensor);
      EXPECT_GE(index, 0) << t.tensor;
      file.tensors.push_back({t.tensor, index, t.region, t.dtype});
      framing.segments.push_back(
          {FramingSegment::Kind::kTensor, "", static_cast<int>(file.tensors.size()) - 1});
    }
    layout.files.push_back(std::move(file));
    framings.push_back(std::move(framing));
  }
  auto plan = BuildCopyPlan(catalog, layout, framings);
  if (!plan.ok()) return plan.status();
  if (out.empty()) out = MakeTempDir("out");
  auto dir = Directory::Open(out);
  if (!dir.ok()) return dir.status();
  return Execute(*plan, *dir, options);
}

ExecutorOptions Options(int threads, uint64_t window) {
  ExecutorOptions options;
  options.threads = threads;
  options.window_bytes = window;
  return options;
}

const Box kW = Box::Full({kRows, kCols});

void ExpectDataLoss(const absl::StatusOr<ExecutionResult>& result, const std::string& path,
                    const std::string& entry, const std::string& tensor) {
  ASSERT_FALSE(result.ok()) << "converted; want DataLoss naming " << entry;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  const std::string message(result.status().message());
  for (const std::string& word :
       {path, "zip entry \"" + entry + "\"", "tensor \"" + tensor + "\"", std::string("CRC-32")}) {
    EXPECT_NE(message.find(word), std::string::npos) << "want \"" << word << "\" in: " << message;
  }
}

TEST(SourceChecksumsTest, IntactArchiveConvertsReadingOnlyWhatNoTensorReads) {
  const TorchFixture fixture = MakeArchive();
  const std::string source = WriteSource(fixture.built.bytes);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int threads : {1, 2}) {
      for (uint64_t window : {uint64_t{4096}, uint64_t{32} << 20}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " threads " + std::to_string(threads) +
                     " window " + std::to_string(window));
        auto result = Convert(
            source, {{"a.bin", {{"w", kW, dtype}}}, {"b.bin", {{"b", Box::Full({10}), dtype}}}},
            Options(threads, window));
        ASSERT_TRUE(result.ok()) << result.status();
        // Only the tail of storage 0 that "w" does not view was read to complete its check.
        EXPECT_EQ(result->crc_bytes_reread, kTail * 4);
      }
    }
  }
}

TEST(SourceChecksumsTest, FlippedByteInTensorDataIsDataLoss) {
  const TorchFixture fixture = MakeArchive();
  const uint64_t w = fixture.Payload("0");
  // First element, one in the middle of a window, the last element "w" views.
  for (uint64_t at : {w, w + 4 * (kRows * kCols / 2) + 1, w + 4 * (kRows * kCols) - 1}) {
    const std::string source = WriteSource(fixture.built.bytes, at);
    for (DType dtype : {DType::kF32, DType::kBF16}) {  // pread rows, then mapped conversion
      for (int threads : {1, 2}) {
        SCOPED_TRACE("byte " + std::to_string(at) + " " + std::string(DTypeName(dtype)) +
                     " threads " + std::to_string(threads));
        ExpectDataLoss(
            Convert(source, {{"a.bin", {{"b", Box::Full({10}), dtype}, {"w", kW, dtype}}}},
                    Options(threads, 4096)),
            source, "archive/data/0", "w");
      }
    }
  }
}

TEST(SourceChecksumsTest, FlippedByteWhereTheTensorDoesNotReachIsDataLoss) {
  // "w" covers only the front of its record; the byte after its last element is still part of
  // the record whose CRC-32 is checked.
  const TorchFixture fixture = MakeArchive();
  const uint64_t after_w = fixture.Payload("0") + 4 * kRows * kCols + 5;
  const std::string source = WriteSource(fixture.built.bytes, after_w);
  ExpectDataLoss(Convert(source, {{"a.bin", {{"w", kW, DType::kF32}}}}, Options(1, 4096)), source,
                 "archive/data/0", "w");
  // So is a part of the tensor the output does not take: rows 10..19 only.
  const std::string row_5 =
      WriteSource(fixture.built.bytes, fixture.Payload("0") + 4 * (5 * kCols + 3));
  ExpectDataLoss(Convert(row_5, {{"a.bin", {{"w", Box{{10, 0}, {10, kCols}}, DType::kF32}}}},
                         Options(1, 4096)),
                 row_5, "archive/data/0", "w");
}

TEST(SourceChecksumsTest, WrongCrcInTheCentralDirectoryIsDataLoss) {
  const TorchFixture intact = MakeArchive();
  const TorchFixture fixture = MakeArchive(intact.entries[3].crc32.value_or(0) ^ 0x1);
  const std::string source = WriteSource(fixture.built.bytes);
  ExpectDataLoss(
      Convert(source, {{"b.bin", {{"b", Box::Full({10}), DType::kF32}}}}, Options(1, 4096)), source,
      "archive/data/1", "b");
}

TEST(SourceChecksumsTest, TensorSplitAcrossTwoFilesAndThreads) {
  const TorchFixture fixture = MakeArchive();
  const OutFiles by_rows = {{"top.bin", {{"w", Box{{0, 0}, {kRows / 2, kCols}}}}},
                            {"bottom.bin", {{"w", Box{{kRows / 2, 0}, {kRows / 2, kCols}}}}}};
  // Columns interleave: each file reads every other half row, so the two threads' runs only
  // become one fragment once both are recorded.
  const OutFiles by_cols = {{"left.bin", {{"w", Box{{0, 0}, {kRows, kCols / 2}}}}},
                            {"right.bin", {{"w", Box{{0, kCols / 2}, {kRows, kCols / 2}}}}}};
  const std::string intact = WriteSource(fixture.built.bytes);
  // A byte of the last row: read by "bottom.bin" and "right.bin".
  const std::string corrupt =
      WriteSource(fixture.built.bytes, fixture.Payload("0") + 4 * (kRows * kCols - 2));
  for (const OutFiles* files : {&by_rows, &by_cols}) {
    for (uint64_t window : {uint64_t{4096}, uint64_t{256}}) {
      SCOPED_TRACE(files->begin()->first + " window " + std::to_string(window));
      auto result = Convert(intact, *files, Options(2, window));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->crc_bytes_reread, kTail * 4);  // the runs of both threads combined
      ExpectDataLoss(Convert(corrupt, *files, Options(2, window)), corrupt, "archive/data/0", "w");
    }
  }
}

// Two output files read rows 0-15 and 40-55 of "w": the pass reads its record in two runs
// with a gap between them, on two threads, from a mapped file and by range reads. The gap and
// the rows after the second run are read once more to complete the CRC-32, and a flipped byte
// anywhere in the record (either run, the gap, past the last run) is DATA_LOSS.
TEST(SourceChecksumsTest, RecordReadInTwoNonAdjacentRunsIsCheckedWhole) {
  auto* store = new kvstore::MemoryDriver("memgap");  // registered drivers are never destroyed
  kvstore::RegisterDriver(store);
  const TorchFixture fixture = MakeArchive();
  const OutFiles files = {{"a.bin", {{"w", Box{{0, 0}, {16, kCols}}}}},
                          {"b.bin", {{"w", Box{{40, 0}, {16, kCols}}}}}};
  const uint64_t w = fixture.Payload("0");
  const uint64_t row = 4 * kCols;
  store->Put("memgap://b/intact.pt", fixture.built.bytes);
  for (const std::string& intact :
       {WriteSource(fixture.built.bytes), std::string("memgap://b/intact.pt")}) {
    SCOPED_TRACE(intact);
    auto result = Convert(intact, files, Options(2, 1024));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->crc_bytes_reread, (kRows - 32) * row + kTail * 4);
  }
  for (uint64_t at : {w + 3 * row + 7, w + 20 * row + 1, w + 45 * row + 2, w + 60 * row}) {
    SCOPED_TRACE("byte " + std::to_string(at));
    const std::string local = WriteSource(fixture.built.bytes, at);
    std::string damaged = fixture.built.bytes;
    damaged[at] = static_cast<char>(~damaged[at]);
    const std::string remote = "memgap://b/damaged" + std::to_string(at) + ".pt";
    store->Put(remote, damaged);
    ExpectDataLoss(Convert(local, files, Options(2, 1024)), local, "archive/data/0", "w");
    ExpectDataLoss(Convert(remote, files, Options(2, 1024)), remote, "archive/data/0", "w");
  }
}

TEST(SourceChecksumsTest, RemoteSourceIsCheckedAsItIsRead) {
  // A torch.save file read by range reads (no mapping): the runs are checksummed as they
  // arrive, and the part of the record no tensor reads is range-read to complete the check.
  auto* store = new kvstore::MemoryDriver;  // registered drivers are never destroyed
  kvstore::RegisterDriver(store);
  const TorchFixture fixture = MakeArchive();
  store->Put("mem://b/intact.pt", fixture.built.bytes);
  std::string damaged = fixture.built.bytes;
  const uint64_t at = fixture.Payload("0") + 4 * (kRows * kCols / 2) + 1;
  damaged[at] = static_cast<char>(~damaged[at]);
  store->Put("mem://b/damaged.pt", damaged);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const OutFiles files = {{"a.bin", {{"w", kW, dtype}}},
                            {"b.bin", {{"b", Box::Full({10}), dtype}}}};
    auto result = Convert("mem://b/intact.pt", files, Options(1, 4096));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->crc_bytes_reread, kTail * 4);
    ExpectDataLoss(Convert("mem://b/damaged.pt", files, Options(2, 4096)), "mem://b/damaged.pt",
                   "archive/data/0", "w");
    // Without the check the damaged file converts.
    ExecutorOptions unchecked = Options(1, 4096);
    unchecked.check_source_crc32 = false;
    EXPECT_TRUE(Convert("mem://b/damaged.pt", files, unchecked).ok());
  }
}

TEST(SourceChecksumsTest, RecordReadInDirectSpansIsNotReadAgain) {
  // A record of 12 MiB, consolidated whole: read with direct I/O in spans of 4 MiB, each read
  // ahead from a block before the end of the one before (SpanReader::overlap). Every byte of
  // the record is read by the pass, so nothing is read again to check it.
  constexpr int64_t kBig = 3 << 20;  // elements
  PickleWriter w;
  w.BeginDict(true);
  w.String("big");
  w.Tensor("FloatStorage", "0", kBig, {kBig / 1024, 1024}, {1024, 1});
  w.EndDict();
  const std::vector<Entry> entries = {{"archive/data.pkl", w.Finish()},
                                      {"archive/byteorder", "little"},
                                      {"archive/data/0", F32s(kBig, -3)},
                                      {"archive/version", "3\n"}};
  const std::string source = WriteSource(BuildZip(entries).bytes);
  auto result = Convert(source, {{"big.bin", {{"big", Box::Full({kBig / 1024, 1024})}}}},
                        Options(1, 32 << 20), "", {"big"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->crc_bytes_reread, 0u);
}

TEST(SourceChecksumsTest, StridedViewIsCheckedByReadingItsRecord) {
  const TorchFixture fixture = MakeArchive();
  const OutFiles files = {{"t.bin", {{"t", Box::Full({6, 4})}}}};
  auto result = Convert(WriteSource(fixture.built.bytes), files, Options(1, 4096));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->crc_bytes_reread, 24 * 4);
  const std::string corrupt = WriteSource(fixture.built.bytes, fixture.Payload("2") + 50);
  ExpectDataLoss(Convert(corrupt, files, Options(1, 4096)), corrupt, "archive/data/2", "t");
}

TEST(SourceChecksumsTest, RecordsNothingReadsFromAreNotChecked) {
  const TorchFixture fixture = MakeArchive();
  const std::string corrupt_b = WriteSource(fixture.built.bytes, fixture.Payload("1") + 3);
  auto result = Convert(corrupt_b, {{"a.bin", {{"w", kW}}}}, Options(1, 4096));
  EXPECT_TRUE(result.ok()) << result.status();
}

TEST(SourceChecksumsTest, OptOut) {
  const TorchFixture fixture = MakeArchive();
  const std::string corrupt = WriteSource(fixture.built.bytes, fixture.Payload("0") + 9);
  ExecutorOptions options = Options(2, 4096);
  options.check_source_crc32 = false;
  auto result = Convert(corrupt, {{"a.bin", {{"w", kW}}}}, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->crc_bytes_reread, 0u);
}

TEST(SourceChecksumsTest, ResumeReusingACommittedFileStillChecksItsSources) {
  // The first attempt commits "a.bin" from a corrupt record and then fails its check; a resume
  // that reuses "a.bin" must fail the same way rather than publish it.
  const TorchFixture fixture = MakeArchive();
  const std::string corrupt = WriteSource(fixture.built.bytes, fixture.Payload("0") + 9);
  const std::string out = MakeTempDir("out");
  const OutFiles files = {{"a.bin", {{"w", kW}}}};
  std::map<std::string, uint64_t> committed;
  ExecutorOptions options = Options(1, 4096);
  options.on_file_committed = [&](const WrittenFile& file) { committed[file.name] = file.xxh3_64; };
  ExpectDataLoss(Convert(corrupt, files, options, out), corrupt, "archive/data/0", "w");
  ASSERT_EQ(committed.count("a.bin"), 1u);
  options.completed_files = committed;
  ExpectDataLoss(Convert(corrupt, files, options, out), corrupt, "archive/data/0", "w");
}

// ---- Crc32Source alone

// A file of 4 bytes and a record of 6000 bytes after them, checked by a Crc32Source that
// `feed` gives runs of the record (offsets within the file), once with the record's true
// CRC-32 and once with a wrong one: Verify's statuses and the bytes it read again (intact).
struct RecordCheck {
  absl::Status intact;
  absl::Status wrong;
  uint64_t reread = 0;
};
RecordCheck CheckRecord(
    const std::function<void(Crc32Source& checksums, const std::string& data)>& feed) {
  const std::string data = F32s(1500, 3);
  const std::string path = MakeTempDir("record") + "/f";
  WriteAll(path, "head" + data);
  SourceFile file{path, 4 + data.size(), {}};
  const uint32_t crc =
      static_cast<uint32_t>(::crc32_z(0, reinterpret_cast<const Bytef*>(data.data()), data.size()));
  auto mapped = MappedFile::Open(path);
  EXPECT_TRUE(mapped.ok()) << mapped.status();
  RecordCheck check;
  if (!mapped.ok()) return check;
  for (uint32_t recorded : {crc, crc ^ 0x80000000u}) {
    file.checksummed = {{4, data.size(), recorded, "archive/data/0"}};
    Crc32Source::FragmentBudget budget{0};
    Crc32Source checksums(file.checksummed, &budget);
    feed(checksums, data);
    const absl::Status status = checksums.Verify(*mapped);
    if (recorded == crc) {
      check.intact = status;
      check.reread = checksums.bytes_reread();
    } else {
      check.wrong = status;
    }
  }
  return check;
}

const std::byte* BytesAt(const std::string& data, uint64_t at) {
  return reinterpret_cast<const std::byte*>(&data[at]);
}

TEST(SourceChecksumsTest, FragmentsBeyondTheCapAreReadAtTheEnd) {
  const RecordCheck check = CheckRecord([](Crc32Source& checksums, const std::string& data) {
    // Every other 2-byte run, back to front: none can merge, so only the first
    // kMaxFragmentsPerRange are kept.
    for (uint64_t at = data.size(); at >= 4; at -= 4) {
      checksums.Read(4 + at - 4, 2, BytesAt(data, at - 4));
    }
  });
  EXPECT_TRUE(check.intact.ok()) << check.intact;
  EXPECT_EQ(check.reread, 6000 - 2 * Crc32Source::kMaxFragmentsPerRange);
  EXPECT_EQ(check.wrong.code(), absl::StatusCode::kDataLoss) << check.wrong;
}

TEST(SourceChecksumsTest, OverlappingRunsCountTheBytesTheyAddOnce) {
  const RecordCheck check = CheckRecord([](Crc32Source& checksums, const std::string& data) {
    // Runs of 1000 bytes, each from 100 bytes before the end of the one before (spans read
    // ahead); then one inside them (a span read again), one past a gap, one reaching from
    // inside the first fragment over the gap into the second, and the rest of the record.
    for (uint64_t at : {0, 900, 1800}) checksums.Read(4 + at, 1000, BytesAt(data, at));
    checksums.Read(4 + 500, 700, BytesAt(data, 500));
    checksums.Read(4 + 4000, 1000, BytesAt(data, 4000));
    checksums.Read(4 + 2000, 2500, BytesAt(data, 2000));
    checksums.Read(4 + 5000, 1000, BytesAt(data, 5000));
  });
  EXPECT_TRUE(check.intact.ok()) << check.intact;
  EXPECT_EQ(check.reread, 0u);
  EXPECT_EQ(check.wrong.code(), absl::StatusCode::kDataLoss) << check.wrong;
}

TEST(SourceChecksumsTest, MemoryBoundCoversRangesAndFragments) {
  SourceFile plain{"a.safetensors", 100, {}};
  SourceFile torch{
      "b.pt", 1 << 20, {{64, 4096, 0, "archive/data/0"}, {8192, 64, 0, "archive/data/1"}}};
  EXPECT_LT(Crc32Source::MemoryBound({plain}), 1024u);
  const uint64_t bound = Crc32Source::MemoryBound({plain, torch});
  EXPECT_GE(bound, Crc32Source::kMaxFragments * 32);
  EXPECT_LE(bound, 16u << 20);
}

}  // namespace
}  // namespace reshard
