// The param folders of a DeepSpeed universal checkpoint with many params, read from remote
// storage (an in-memory store whose every range read waits a round trip): fetched several at
// once, in a bounded number of requests per file, and cataloged in param order.

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/deepspeed/universal_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr int kExtraParams = 64;

// The universal fixture (three params) plus zero/extra.<i>/fp32.pt for kExtraParams params of
// 2 elements each, as files relative to the input folder.
std::map<std::string, std::string> UniversalSaveFiles() {
  const std::string dir = MakeTempDir("universal-metadata");
  WriteUniversalFolder(dir, UniversalFolderOptions());
  for (int i = 0; i < kExtraParams; ++i) {
    const std::string folder = absl::StrCat(dir, "/global_step5_universal/zero/extra.", i);
    fs::create_directories(folder);
    WriteUniversalState(folder + "/fp32.pt", UniversalState{{2}, FixtureF32Bytes(2, i)});
  }
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    files[fs::relative(entry.path(), dir).string()] = ReadAll(entry.path().string());
  }
  return files;
}

TEST(UniversalRemoteMetadataTest, ParamFoldersReadConcurrentlyInOrder) {
  const std::string url = "mem://universal-metadata/save";
  const std::map<std::string, std::string> files = UniversalSaveFiles();
  const MetadataLoad load = UploadAndMeasure(
      url, files, absl::Milliseconds(5), absl::StrCat("universal, ", kExtraParams + 3, " params"));
  ASSERT_TRUE(load.loaded.ok()) << load.loaded.status();
  EXPECT_GE(load.max_concurrent_reads, 8);
  EXPECT_LE(load.max_concurrent_reads, 16);
  EXPECT_LE(load.reads, 3 * static_cast<int>(files.size()));

  // extra.<i> from its own fp32.pt, the files cataloged in param order.
  const Catalog& catalog = load.loaded->catalog;
  int previous_file = -1;
  for (int i = 0; i < kExtraParams; ++i) {
    const std::string name = absl::StrCat("extra.", i);
    const int index = catalog.Find(name);
    ASSERT_GE(index, 0) << name;
    const CatalogTensor& tensor = catalog.tensors[index];
    EXPECT_EQ(tensor.shape, (Shape{2})) << name;
    ASSERT_EQ(tensor.pieces.size(), 1u) << name;
    EXPECT_EQ(catalog.files[tensor.pieces[0].file].path,
              absl::StrCat(url, "/global_step5_universal/zero/", name, "/fp32.pt"));
    EXPECT_GT(tensor.pieces[0].file, previous_file) << name;
    previous_file = tensor.pieces[0].file;
  }
}

}  // namespace
}  // namespace reshard
