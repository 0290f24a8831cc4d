// Tests of the torch.save zip container reader on archives built byte by byte
// (lib/testing/zip_builder.h): the layout torch writes (stored entries, "FB" padding extra,
// ZIP64 end records), then every kind of corruption the reader must refuse with a DataLoss
// naming the file and a byte offset.

#include "lib/formats/torch/zip_archive.h"

#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/byte_source.h"
#include "lib/testing/test_files.h"
#include "lib/testing/zip_builder.h"

namespace reshard {
namespace {

using zip_testing::BuildZip;
using zip_testing::Built;
using zip_testing::Entry;
using zip_testing::Options;

void Set32(std::string& out, uint64_t at, uint64_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void Set64(std::string& out, uint64_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void Set16(std::string& out, uint64_t at, uint64_t v) {
  for (int i = 0; i < 2; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

std::vector<Entry> TorchLikeEntries() {
  return {
      {"ckpt/data.pkl", std::string("\x80\x02}q\x00.", 6)},
      {"ckpt/byteorder", "little"},
      {"ckpt/data/0", std::string(24, '\x01')},
      {"ckpt/data/1", std::string(7, '\x02')},
      {"ckpt/version", "3\n"},
      {"ckpt/.data/serialization_id", std::string(40, '7')},
  };
}

constexpr char kPath[] = "/models/ckpt.pt";

// A RangeReadSource over `bytes` (kept by the caller) that counts its reads.
std::unique_ptr<RangeReadSource> SparseSource(const std::string& bytes, const std::string& path,
                                              RangeReadOptions options = {}) {
  return std::make_unique<RangeReadSource>(
      path, bytes.size(),
      [&bytes](uint64_t offset, absl::Span<char> out) {
        bytes.copy(out.data(), out.size(), offset);
        return absl::OkStatus();
      },
      options);
}

// Parses `bytes` from a view and by range reads (the same parser reading only what it needs):
// both must give the same entries, or the same error.
absl::StatusOr<ZipArchive> ParseBoth(const std::string& bytes) {
  absl::StatusOr<ZipArchive> view = ZipArchive::Parse(bytes, kPath);
  std::unique_ptr<RangeReadSource> source = SparseSource(bytes, kPath);
  absl::StatusOr<ZipArchive> sparse = ZipArchive::Parse(*source, {});
  EXPECT_EQ(view.status(), sparse.status());
  if (view.ok() && sparse.ok()) {
    EXPECT_EQ(view->top(), sparse->top());
    EXPECT_EQ(view->entries().size(), sparse->entries().size());
    for (size_t i = 0; i < std::min(view->entries().size(), sparse->entries().size()); ++i) {
      const ZipEntry& a = view->entries()[i];
      const ZipEntry& b = sparse->entries()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.data_offset, b.data_offset) << a.name;
      EXPECT_EQ(a.size, b.size) << a.name;
      EXPECT_EQ(a.crc32, b.crc32) << a.name;
    }
  }
  return view;
}

// A DataLoss naming the file, the byte offset and `what`.
void ExpectDataLoss(const absl::StatusOr<ZipArchive>& result, const std::string& what) {
  ASSERT_FALSE(result.ok()) << "accepted an archive that should fail with: " << what;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  const std::string message(result.status().message());
  EXPECT_NE(message.find(kPath), std::string::npos) << message;
  EXPECT_NE(message.find("byte offset"), std::string::npos) << message;
  EXPECT_NE(message.find(what), std::string::npos) << "want \"" << what << "\" in: " << message;
}

TEST(ZipArchiveTest, TorchLayoutStoredEntriesFbPaddingZip64End) {
  const std::vector<Entry> entries = TorchLikeEntries();
  const Built b = BuildZip(entries);
  auto archive = ParseBoth(b.bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->top(), "ckpt");
  ASSERT_EQ(archive->entries().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = archive->entries()[i];
    EXPECT_EQ(e.name, entries[i].name);
    EXPECT_EQ(e.data_offset, b.payload[i]) << e.name;
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    EXPECT_EQ(e.size, entries[i].data.size());
    EXPECT_EQ(e.compressed_size, entries[i].data.size());
    EXPECT_EQ(e.method, 0);
    EXPECT_EQ(e.crc32, ::crc32_z(0, reinterpret_cast<const Bytef*>(entries[i].data.data()),
                                 entries[i].data.size()))
        << e.name;
    EXPECT_EQ(b.bytes.substr(e.data_offset, e.size), entries[i].data);
  }
  const ZipEntry* data0 = archive->Find("data/0");
  ASSERT_NE(data0, nullptr);
  EXPECT_EQ(data0->name, "ckpt/data/0");
  EXPECT_EQ(data0->size, 24u);
  ASSERT_NE(archive->Find(".data/serialization_id"), nullptr);
  EXPECT_EQ(archive->Find("data/2"), nullptr);
  EXPECT_EQ(archive->Find("ckpt/data/0"), nullptr);  // names are below the top folder
}

TEST(ZipArchiveTest, ParsesFromAFileOnDisk) {
  const std::string dir = MakeTempDir("zip");
  const std::string path = dir + "/model.pt";
  WriteAll(path, BuildZip(TorchLikeEntries()).bytes);
  const std::string bytes = ReadAll(path);
  auto archive = ZipArchive::Parse(bytes, path);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->entries().size(), 6u);
}

TEST(ZipArchiveTest, ZeroPadAndUnalignedPayloads) {
  // FB extra with pad 0, alignment 1 (every start is aligned), and no FB field at all.
  Options aligned1;
  aligned1.alignment = 1;
  auto a = ParseBoth(BuildZip(TorchLikeEntries(), aligned1).bytes);
  ASSERT_TRUE(a.ok()) << a.status();
  Options no_fb;
  no_fb.fb_padding = false;
  const Built b = BuildZip(TorchLikeEntries(), no_fb);
  auto archive = ParseBoth(b.bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  for (size_t i = 0; i < b.payload.size(); ++i) {
    EXPECT_EQ(archive->entries()[i].data_offset, b.payload[i]);
  }
}

TEST(ZipArchiveTest, ClassicEndRecordOnlyAndComment) {
  Options options;
  options.zip64_end = false;
  options.comment = "a comment PK\x05\x06 that looks like a signature";
  auto archive = ParseBoth(BuildZip(TorchLikeEntries(), options).bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->entries().size(), 6u);
  EXPECT_EQ(archive->top(), "ckpt");
}

TEST(ZipArchiveTest, Zip64EndRecordHoldsTheRealCounts) {
  Built b = BuildZip(TorchLikeEntries());
  // Saturate the classic record as a writer with more than 65535 entries would.
  Set16(b.bytes, b.eocd + 8, 0xFFFF);
  Set16(b.bytes, b.eocd + 10, 0xFFFF);
  Set32(b.bytes, b.eocd + 12, 0xFFFFFFFF);
  Set32(b.bytes, b.eocd + 16, 0xFFFFFFFF);
  auto archive = ParseBoth(b.bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->entries().size(), 6u);
}

TEST(ZipArchiveTest, Zip64ExtraFieldInCentralDirectory) {
  std::vector<Entry> entries = TorchLikeEntries();
  entries[2].zip64_extra = true;
  entries[4].zip64_extra = true;
  const Built b = BuildZip(entries);
  auto archive = ParseBoth(b.bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  const ZipEntry* data0 = archive->Find("data/0");
  ASSERT_NE(data0, nullptr);
  EXPECT_EQ(data0->size, 24u);
  EXPECT_EQ(data0->compressed_size, 24u);
  EXPECT_EQ(data0->data_offset, b.payload[2]);
  EXPECT_EQ(archive->Find("version")->data_offset, b.payload[4]);
}

TEST(ZipArchiveTest, Zip64ExtraFieldTooShort) {
  std::vector<Entry> entries = TorchLikeEntries();
  entries[2].zip64_extra = true;
  Built b = BuildZip(entries);
  // Claim only 8 bytes of ZIP64 data: three saturated fields need 24.
  const uint64_t extra = b.central[2] + 46 + entries[2].name.size();
  Set16(b.bytes, extra + 2, 8);
  ExpectDataLoss(ParseBoth(b.bytes), "ZIP64 extra field is too short");
}

TEST(ZipArchiveTest, ExtraFieldOverrunsItsEntry) {
  std::vector<Entry> entries = TorchLikeEntries();
  entries[2].zip64_extra = true;
  Built b = BuildZip(entries);
  const uint64_t extra = b.central[2] + 46 + entries[2].name.size();
  Set16(b.bytes, extra + 2, 200);
  ExpectDataLoss(ParseBoth(b.bytes), "extra field overruns");
}

TEST(ZipArchiveTest, CompressedEntriesAreListedAndFlagged) {
  std::vector<Entry> entries = TorchLikeEntries();
  entries[2].method = 8;
  entries[2].data = "deflated";
  entries[2].uncompressed_size = 4096;
  auto archive = ParseBoth(BuildZip(entries).bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  const ZipEntry* data0 = archive->Find("data/0");
  ASSERT_NE(data0, nullptr);
  EXPECT_EQ(data0->method, 8);
  EXPECT_EQ(data0->size, 4096u);
  EXPECT_EQ(data0->compressed_size, 8u);
}

TEST(ZipArchiveTest, StoredEntryWithDifferentSizes) {
  std::vector<Entry> entries = TorchLikeEntries();
  entries[3].uncompressed_size = 8;  // stored, but compressed 7 != uncompressed 8
  ExpectDataLoss(ParseBoth(BuildZip(entries).bytes), "different compressed and uncompressed sizes");
}

TEST(ZipArchiveTest, EveryTruncationIsRefused) {
  const std::string bytes = BuildZip(TorchLikeEntries()).bytes;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto archive = ParseBoth(bytes.substr(0, cut));
    ASSERT_FALSE(archive.ok()) << "prefix of " << cut << " bytes accepted";
    EXPECT_EQ(archive.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(archive.status().message().find("byte offset"), absl::string_view::npos)
        << archive.status();
  }
  ExpectDataLoss(ParseBoth(""), "too short");
  ExpectDataLoss(ParseBoth(bytes.substr(0, bytes.size() - 1)), "no end of central directory");
}

TEST(ZipArchiveTest, TruncatedCentralDirectory) {
  Built b = BuildZip(TorchLikeEntries());
  // The directory claims fewer bytes than its six entries need.
  Set64(b.bytes, b.zip64_end + 40, b.cd_size - 30);
  ExpectDataLoss(ParseBoth(b.bytes), "central directory");
  // More entries than the directory holds.
  Built c = BuildZip(TorchLikeEntries());
  Set64(c.bytes, c.zip64_end + 32, 7);
  ExpectDataLoss(ParseBoth(c.bytes), "central directory is truncated");
  // A directory that runs past the end of the file.
  Built d = BuildZip(TorchLikeEntries());
  Set64(d.bytes, d.zip64_end + 40, d.bytes.size());
  ExpectDataLoss(ParseBoth(d.bytes), "runs past the end of the file");
  // A directory offset far beyond the file (no overflow in offset + size).
  Built e = BuildZip(TorchLikeEntries());
  Set64(e.bytes, e.zip64_end + 48, UINT64_MAX - 4);
  ExpectDataLoss(ParseBoth(e.bytes), "central directory");
}

TEST(ZipArchiveTest, CentralEntryOverrunsTheDirectory) {
  Built b = BuildZip(TorchLikeEntries());
  Set16(b.bytes, b.central.back() + 28, 5000);  // last name length runs past the directory
  ExpectDataLoss(ParseBoth(b.bytes), "overruns the directory");
}

TEST(ZipArchiveTest, BadSignatures) {
  {
    Built b = BuildZip(TorchLikeEntries());
    b.bytes[b.central[1]] = 'X';
    ExpectDataLoss(ParseBoth(b.bytes), "bad central directory entry signature");
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    b.bytes[b.local[2] + 3] = 0x7F;
    auto result = ParseBoth(b.bytes);
    ExpectDataLoss(result, "bad local header signature");
    EXPECT_NE(result.status().message().find("ckpt/data/0"), absl::string_view::npos);
    EXPECT_NE(result.status().message().find("byte offset " + std::to_string(b.local[2])),
              absl::string_view::npos)
        << result.status();
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    b.bytes[b.zip64_end] = 'Q';
    ExpectDataLoss(ParseBoth(b.bytes), "bad ZIP64 end of central directory");
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    Set64(b.bytes, b.locator + 8, b.bytes.size() - 10);  // locator points past the end
    ExpectDataLoss(ParseBoth(b.bytes), "ZIP64 end of central directory");
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    b.bytes[b.eocd + 1] = 'k';  // classic end record gone
    ExpectDataLoss(ParseBoth(b.bytes), "no end of central directory");
  }
}

TEST(ZipArchiveTest, EntryDataPastEndOfFile) {
  {
    // A central directory size larger than the bytes that follow the local header.
    Built b = BuildZip(TorchLikeEntries());
    Set32(b.bytes, b.central[2] + 20, 0x7FFFFFF0);
    Set32(b.bytes, b.central[2] + 24, 0x7FFFFFF0);
    auto result = ParseBoth(b.bytes);
    ExpectDataLoss(result, "data of \"ckpt/data/0\"");
    EXPECT_NE(result.status().message().find("runs past the end"), absl::string_view::npos);
  }
  {
    // Same with ZIP64 sizes near 2^64: no wrap-around.
    std::vector<Entry> entries = TorchLikeEntries();
    entries[2].zip64_extra = true;
    Built b = BuildZip(entries);
    const uint64_t extra = b.central[2] + 46 + entries[2].name.size();
    Set64(b.bytes, extra + 4, UINT64_MAX - 3);
    Set64(b.bytes, extra + 12, UINT64_MAX - 3);
    ExpectDataLoss(ParseBoth(b.bytes), "data of \"ckpt/data/0\"");
  }
  {
    // The local header itself is past the end.
    Built b = BuildZip(TorchLikeEntries());
    Set32(b.bytes, b.central[3] + 42, b.bytes.size() - 4);
    ExpectDataLoss(ParseBoth(b.bytes), "local header of \"ckpt/data/1\"");
  }
  {
    // The local header's extra length pushes the payload past the end.
    Built b = BuildZip(TorchLikeEntries());
    Set16(b.bytes, b.local[5] + 28, 0xFFFF);
    ExpectDataLoss(ParseBoth(b.bytes), "runs past the end of the file");
  }
  {
    // A ZIP64 local offset near 2^64.
    std::vector<Entry> entries = TorchLikeEntries();
    entries[1].zip64_extra = true;
    Built b = BuildZip(entries);
    const uint64_t extra = b.central[1] + 46 + entries[1].name.size();
    Set64(b.bytes, extra + 20, UINT64_MAX - 10);
    ExpectDataLoss(ParseBoth(b.bytes), "local header of \"ckpt/byteorder\"");
  }
}

TEST(ZipArchiveTest, EntryCountAndDirectorySizeCaps) {
  {
    Built b = BuildZip(TorchLikeEntries());
    Set64(b.bytes, b.zip64_end + 32, ZipArchive::kMaxEntries + 1);
    ExpectDataLoss(ParseBoth(b.bytes), "entries");
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    Set64(b.bytes, b.zip64_end + 32, UINT64_MAX);
    ExpectDataLoss(ParseBoth(b.bytes), "entries");
  }
  {
    Built b = BuildZip(TorchLikeEntries());
    Set64(b.bytes, b.zip64_end + 40, ZipArchive::kMaxCentralDirectoryBytes + 1);
    ExpectDataLoss(ParseBoth(b.bytes), "central directory of");
  }
  {
    // The largest allowed count in a tiny file fails fast on the truncated directory.
    Built b = BuildZip(TorchLikeEntries());
    Set64(b.bytes, b.zip64_end + 32, ZipArchive::kMaxEntries);
    const auto start = std::chrono::steady_clock::now();
    ExpectDataLoss(ParseBoth(b.bytes), "central directory is truncated");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  }
}

TEST(ZipArchiveTest, NoEntries) { ExpectDataLoss(ParseBoth(BuildZip({}).bytes), "no entries"); }

TEST(ZipArchiveTest, MissingTopFolder) {
  std::vector<Entry> entries = {{"data.pkl", "x"}, {"ckpt/data/0", "y"}};
  auto result = ParseBoth(BuildZip(entries).bytes);
  ExpectDataLoss(result, "not in a folder");
  EXPECT_NE(result.status().message().find("data.pkl"), absl::string_view::npos);
}

TEST(ZipArchiveTest, TopFolderComesFromTheFirstEntry) {
  std::vector<Entry> entries = {{"archive/data.pkl", "x"}, {"archive/data/0", "y"}};
  auto archive = ParseBoth(BuildZip(entries).bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->top(), "archive");
  ASSERT_NE(archive->Find("data.pkl"), nullptr);
  EXPECT_EQ(archive->Find("data.pkl")->size, 1u);
}

TEST(ZipArchiveTest, EmptyEntryHasNoDataDescriptor) {
  std::vector<Entry> entries = {{"t/data.pkl", "."}, {"t/data/0", ""}, {"t/version", "3\n"}};
  auto archive = ParseBoth(BuildZip(entries).bytes);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->Find("data/0")->size, 0u);
}

// Archives like torch.save's of `count` storage records of `record_bytes` each, named with
// `name_pad` extra characters (a longer central directory).
Built ManyRecords(int count, size_t record_bytes, size_t name_pad = 0) {
  std::vector<Entry> entries = {{"ckpt/data.pkl", std::string(3000, 'p')},
                                {"ckpt/byteorder", "little"}};
  for (int i = 0; i < count; ++i) {
    entries.push_back({"ckpt/data/" + std::string(name_pad, 'x') + std::to_string(i),
                       std::string(record_bytes, static_cast<char>(i))});
  }
  entries.push_back({"ckpt/version", "3\n"});
  return BuildZip(entries);
}

TEST(ZipArchiveSparseTest, ReadsAreFewAndIndependentOfTheNumberOfSmallRecords) {
  // About 3 MiB of records, in 300 of 10 KiB or 3000 of 1 KiB: the local headers lie close
  // together and are read in windows of at most 1 MiB (RangeReadOptions::max_read); the tail
  // holds the end records and the central directory. The count of reads depends on the bytes
  // the headers spread over, not on how many there are.
  for (const auto& [count, record] : {std::pair<int, size_t>{300, 10240}, {3000, 1024}}) {
    SCOPED_TRACE(count);
    const Built b = ManyRecords(count, record);
    ASSERT_GT(b.bytes.size(), 2 * ZipArchive::kTailBytes);
    std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, kPath);
    ZipArchive::ParseOptions options;
    options.prefetch_payloads = {"data.pkl"};
    absl::StatusOr<ZipArchive> archive = ZipArchive::Parse(*source, options);
    ASSERT_TRUE(archive.ok()) << archive.status();
    EXPECT_EQ(archive->entries().size(), static_cast<size_t>(count) + 3);
    // The tail, then the headers (with data.pkl) in 1 MiB windows: 3 or 4 for the 2.9 MB
    // and 3.2 MB before the tail.
    const uint64_t windows = (b.bytes.size() - ZipArchive::kTailBytes + (1 << 20) - 1) >> 20;
    EXPECT_LE(windows, 4u);
    EXPECT_EQ(source->reads(), static_cast<int>(1 + windows)) << b.bytes.size();
    // data.pkl came with its header.
    const ZipEntry* pickle = archive->Find("data.pkl");
    ASSERT_NE(pickle, nullptr);
    const int before = source->reads();
    ASSERT_TRUE(source->Read(pickle->data_offset, pickle->size, "data.pkl").ok());
    EXPECT_EQ(source->reads(), before);
    // The records between the headers were read once (cheaper than a request per header).
    EXPECT_LT(source->bytes_read(), b.bytes.size() + ZipArchive::kTailBytes);
  }
}

TEST(ZipArchiveSparseTest, FarApartHeadersAreReadSeveralAtOnceOneRequestEach) {
  // Records of 1 MiB: every header is its own read (merging would read the records), in
  // parallel; the central directory is in the tail.
  const Built b = ManyRecords(40, 1 << 20);
  std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, kPath);
  absl::StatusOr<ZipArchive> archive = ZipArchive::Parse(*source, {});
  ASSERT_TRUE(archive.ok()) << archive.status();
  // The tail; data.pkl, byteorder and record 0's headers in one; records 1..39; the last one
  // and version are in the tail.
  EXPECT_EQ(source->reads(), 1 + 1 + 39);
  EXPECT_LT(source->bytes_read(), 2 * ZipArchive::kTailBytes + 41 * 30);
}

TEST(ZipArchiveSparseTest, CentralDirectoryBeforeTheTailIsOneRead) {
  // 3000 records with long names: the central directory (about 600 KB) starts before the
  // tail and is read with one request.
  const Built b = ManyRecords(3000, 64, 100);
  ASSERT_GT(b.cd_size, ZipArchive::kTailBytes);
  std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, kPath);
  absl::StatusOr<ZipArchive> archive = ZipArchive::Parse(*source, {});
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(source->reads(), 3);  // tail, directory, headers
}

TEST(ZipArchiveSparseTest, ShortTailReadsOnlyTheEndAndFallsBackForLongComments) {
  // Records of 1 MiB: a tail of 4 KiB holds the end records and the central directory.
  const Built b = ManyRecords(3, 1 << 20);
  std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, kPath);
  ZipArchive::ParseOptions options;
  options.tail_bytes = 4096;
  absl::StatusOr<ZipArchive> archive = ZipArchive::Parse(*source, options);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ(archive->entries().size(), 6u);
  // The short tail, the first headers, records 1 and 2 (version's is in the tail).
  EXPECT_EQ(source->reads(), 4);
  EXPECT_LT(source->bytes_read(), 4096u + 3 * (30 + 200) + 3000 + 4096);
  // A comment longer than the short tail: the end record lies before it, and the full
  // kTailBytes are read; the same entries as from a view.
  Options with_comment;
  with_comment.comment = std::string(6000, 'c');
  const std::string commented = BuildZip(TorchLikeEntries(), with_comment).bytes;
  std::unique_ptr<RangeReadSource> retried = SparseSource(commented, kPath);
  absl::StatusOr<ZipArchive> parsed = ZipArchive::Parse(*retried, options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->entries().size(), ParseBoth(commented)->entries().size());
  // A cut archive still fails naming the end record.
  const std::string cut_bytes = b.bytes.substr(0, b.bytes.size() - 5);
  std::unique_ptr<RangeReadSource> cut = SparseSource(cut_bytes, kPath);
  ExpectDataLoss(ZipArchive::Parse(*cut, options), "no end of central directory record");
}

TEST(ZipArchiveSparseTest, LyingSizesAreRefusedBeforeAnyRequest) {
  {
    // A directory claimed past the end: refused from the tail alone.
    Built b = ManyRecords(50, 1 << 16);
    Set64(b.bytes, b.zip64_end + 40, b.bytes.size());
    std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, "s3://models/m.bin");
    absl::StatusOr<ZipArchive> result = ZipArchive::Parse(*source, {});
    ASSERT_TRUE(absl::IsDataLoss(result.status())) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                testing::AllOf(testing::HasSubstr("s3://models/m.bin"),
                               testing::HasSubstr("central directory"),
                               testing::HasSubstr("byte offset " + std::to_string(b.cd_offset))));
    EXPECT_EQ(source->reads(), 1);
  }
  {
    // A directory size within the file but over the cap: no allocation, no read.
    Built b = ManyRecords(50, 1 << 16);
    Set64(b.bytes, b.zip64_end + 40, ZipArchive::kMaxCentralDirectoryBytes + 1);
    std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, "s3://models/m.bin");
    EXPECT_TRUE(absl::IsDataLoss(ZipArchive::Parse(*source, {}).status()));
    EXPECT_EQ(source->reads(), 1);
  }
  {
    // A local header offset past the end: named with the entry and offset, not read.
    Built b = ManyRecords(50, 1 << 16);
    Set32(b.bytes, b.central[7] + 42, 0xFFFFFFF0);
    std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, "s3://models/m.bin");
    absl::StatusOr<ZipArchive> result = ZipArchive::Parse(*source, {});
    ASSERT_TRUE(absl::IsDataLoss(result.status())) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                testing::AllOf(testing::HasSubstr("s3://models/m.bin"),
                               testing::HasSubstr("local header of \"ckpt/data/5\""),
                               testing::HasSubstr("byte offset 4294967280")));
  }
  {
    // A record whose data passes the end, found from its local header.
    Built b = ManyRecords(50, 1 << 16);
    Set16(b.bytes, b.local.back() + 28, 0xFFFF);
    std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, "s3://models/m.bin");
    absl::StatusOr<ZipArchive> result = ZipArchive::Parse(*source, {});
    ASSERT_TRUE(absl::IsDataLoss(result.status())) << result.status();
    EXPECT_THAT(std::string(result.status().message()),
                testing::AllOf(testing::HasSubstr("s3://models/m.bin"),
                               testing::HasSubstr("data of \"ckpt/version\""),
                               testing::HasSubstr("runs past the end of the file")));
  }
}

TEST(ZipArchiveSparseTest, MetadataHeldInMemoryIsCapped) {
  const Built b = ManyRecords(3000, 64, 100);  // a 600 KB central directory
  RangeReadOptions options;
  options.max_loaded_bytes = ZipArchive::kTailBytes + 1000;
  std::unique_ptr<RangeReadSource> source = SparseSource(b.bytes, "s3://models/m.bin", options);
  absl::StatusOr<ZipArchive> result = ZipArchive::Parse(*source, {});
  ASSERT_TRUE(absl::IsResourceExhausted(result.status())) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              testing::AllOf(testing::HasSubstr("s3://models/m.bin"),
                             testing::HasSubstr("central directory"),
                             testing::HasSubstr("byte offset " + std::to_string(b.cd_offset))));
}

TEST(ZipArchiveSparseTest, FailedReadsNameTheFileAndWhatWasRead) {
  const Built b = ManyRecords(20, 1 << 20);
  int calls = 0;
  RangeReadSource source("s3://models/m.bin", b.bytes.size(),
                         [&](uint64_t offset, absl::Span<char> out) {
                           if (++calls > 1) return absl::UnavailableError("HTTP 503 SlowDown");
                           b.bytes.copy(out.data(), out.size(), offset);
                           return absl::OkStatus();
                         });
  absl::StatusOr<ZipArchive> result = ZipArchive::Parse(source, {});
  ASSERT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_THAT(
      std::string(result.status().message()),
      testing::AllOf(testing::HasSubstr("s3://models/m.bin"), testing::HasSubstr("local headers"),
                     testing::HasSubstr("byte offset"), testing::HasSubstr("503 SlowDown")));
}

}  // namespace
}  // namespace reshard
