// The torch.save reader on remote inputs (the memory kvstore driver standing in for S3): a
// file, a sharded folder with its index and a folder without one read to the same Catalog as
// their local copies, with a few range reads per file whatever the number of tensors; other
// checkpoint layouts left unclaimed; damaged files refused naming the remote path.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

// A state dict of `count` F32 tensors of `numel` elements ("layers.<first + i>.w"), each in a
// storage record of its own.
TorchSaveFile StateDict(int first, int count, int64_t numel) {
  PickleWriter p;
  p.BeginDict(true);
  std::vector<std::pair<std::string, std::string>> storages;
  for (int i = 0; i < count; ++i) {
    const std::string key = std::to_string(i);
    p.String(absl::StrCat("layers.", first + i, ".w"));
    p.Tensor("FloatStorage", key, numel, {numel}, {1});
    storages.emplace_back(key, TestPattern(static_cast<size_t>(numel) * 4, first + i));
  }
  p.EndDict();
  return BuildTorchSave(p.Finish(), storages);
}

class TorchRemoteTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = new kvstore::MemoryDriver;  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
    local_ = MakeTempDir("torch_remote");
  }
  // Puts `bytes` as mem://b/<name> and as <local>/<name>.
  void Put(const std::string& name, const std::string& bytes) {
    store_->Put("mem://b/" + name, bytes);
    const std::string path = local_ + "/" + name;
    const size_t slash = path.rfind('/');
    MakeDirs(path.substr(0, slash));
    WriteAll(path, bytes);
  }
  static void MakeDirs(const std::string& dir) {
    ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  }
  // A sharded folder `name` of `shards` files of `per_shard` tensors, with its index.
  void PutSharded(const std::string& name, int shards, int per_shard, int64_t numel) {
    std::string map;
    for (int s = 0; s < shards; ++s) {
      const std::string file =
          absl::StrCat("pytorch_model-0000", s + 1, "-of-0000", shards, ".bin");
      Put(name + "/" + file, StateDict(s * per_shard, per_shard, numel).bytes);
      for (int i = 0; i < per_shard; ++i) {
        absl::StrAppend(&map, map.empty() ? "" : ",", "\"layers.", s * per_shard + i, ".w\":\"",
                        file, "\"");
      }
    }
    Put(name + "/pytorch_model.bin.index.json",
        absl::StrCat("{\"metadata\":{},\"weight_map\":{", map, "}}"));
  }
  absl::StatusOr<InputModel> Read(const std::string& path) {
    return TorchInput().Read(path, ReadOptions());
  }
  // Both models hold the same tensors at the same offsets of files of the same sizes and
  // checksummed ranges.
  static void ExpectSameModel(const InputModel& remote, const InputModel& local) {
    EXPECT_EQ(remote.arrangement, local.arrangement);
    ASSERT_EQ(remote.parts.size(), local.parts.size());
    for (size_t p = 0; p < remote.parts.size(); ++p) {
      const Catalog& a = remote.parts[p];
      const Catalog& b = local.parts[p];
      ASSERT_EQ(a.files.size(), b.files.size());
      for (size_t f = 0; f < a.files.size(); ++f) {
        EXPECT_THAT(a.files[f].path, ::testing::StartsWith("mem://b/"));
        EXPECT_EQ(a.files[f].size, b.files[f].size);
        ASSERT_EQ(a.files[f].checksummed.size(), b.files[f].checksummed.size());
        for (size_t r = 0; r < a.files[f].checksummed.size(); ++r) {
          EXPECT_EQ(a.files[f].checksummed[r].offset, b.files[f].checksummed[r].offset);
          EXPECT_EQ(a.files[f].checksummed[r].crc32, b.files[f].checksummed[r].crc32);
        }
      }
      ASSERT_EQ(a.tensors.size(), b.tensors.size());
      for (size_t t = 0; t < a.tensors.size(); ++t) {
        EXPECT_EQ(a.tensors[t].name, b.tensors[t].name);
        EXPECT_EQ(a.tensors[t].shape, b.tensors[t].shape);
        ASSERT_EQ(a.tensors[t].pieces.size(), 1u);
        EXPECT_EQ(a.tensors[t].pieces[0].byte_offset, b.tensors[t].pieces[0].byte_offset);
        EXPECT_EQ(a.tensors[t].pieces[0].file, b.tensors[t].pieces[0].file);
      }
    }
  }

  kvstore::MemoryDriver* store_ = nullptr;
  std::string local_;
};

TEST_F(TorchRemoteTest, SingleFileReadsAsItsLocalCopy) {
  Put("one/model.pt", StateDict(0, 50, 1000).bytes);
  EXPECT_TRUE(TorchInput().Probe("mem://b/one/model.pt").value());
  absl::StatusOr<const InputFormat*> detected = DetectInputFormat("mem://b/one/model.pt");
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ((*detected)->id(), "torch");
  absl::StatusOr<InputModel> remote = Read("mem://b/one/model.pt");
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::StatusOr<InputModel> local = Read(local_ + "/one/model.pt");
  ASSERT_TRUE(local.ok()) << local.status();
  ExpectSameModel(*remote, *local);
  EXPECT_EQ(remote->parts[0].tensors.size(), 50u);
}

TEST_F(TorchRemoteTest, ShardedFolderMetadataTakesFewReadsWhateverTheTensorCount) {
  // Tensors of 1 KiB: each file's local headers lie close together.
  for (int per_shard : {300, 3000}) {
    SCOPED_TRACE(per_shard);
    const std::string name = absl::StrCat("sharded", per_shard);
    PutSharded(name, 2, per_shard, 256);
    const int before = store_->reads();
    absl::StatusOr<InputModel> remote = Read("mem://b/" + name);
    ASSERT_TRUE(remote.ok()) << remote.status();
    const int reads = store_->reads() - before;
    // The index; per shard the tail and the headers with data.pkl in windows of at most 1 MiB
    // (one for the 400 KB shards, four for the 3.8 MB ones).
    EXPECT_EQ(reads, 1 + 2 * (1 + (per_shard == 300 ? 1 : 4)));
    absl::StatusOr<InputModel> local = Read(local_ + "/" + name);
    ASSERT_TRUE(local.ok()) << local.status();
    ExpectSameModel(*remote, *local);
    EXPECT_EQ(remote->parts[0].tensors.size(), 2u * per_shard);
  }
}

TEST_F(TorchRemoteTest, FolderWithoutIndex) {
  Put("noindex/a.bin", StateDict(0, 5, 100).bytes);
  Put("noindex/b.bin", StateDict(5, 5, 100).bytes);
  EXPECT_TRUE(TorchInput().Probe("mem://b/noindex").value());
  absl::StatusOr<InputModel> remote = Read("mem://b/noindex");
  ASSERT_TRUE(remote.ok()) << remote.status();
  absl::StatusOr<InputModel> local = Read(local_ + "/noindex");
  ASSERT_TRUE(local.ok()) << local.status();
  ExpectSameModel(*remote, *local);
}

TEST_F(TorchRemoteTest, OtherCheckpointLayoutsAreNotClaimed) {
  const std::string pt = StateDict(0, 2, 10).bytes;
  for (const char* marker :
       {"latest", "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        ".metadata", "__0_0.distcp", "latest_checkpointed_iteration.txt",
        "pytorch_model-meta-dist-00000.json"}) {
    SCOPED_TRACE(marker);
    const std::string dir = absl::StrCat("other/", std::hash<std::string>()(marker));
    store_->Put(absl::StrCat("mem://b/", dir, "/model.pt"), pt);
    store_->Put(absl::StrCat("mem://b/", dir, "/", marker), pt);
    EXPECT_FALSE(TorchInput().Probe("mem://b/" + dir).value());
    absl::StatusOr<const InputFormat*> detected = DetectInputFormat("mem://b/" + dir);
    EXPECT_TRUE(absl::IsInvalidArgument(detected.status())) << detected.status();
    EXPECT_THAT(detected.status().message(), HasSubstr("mem://b/" + dir));
  }
}

TEST_F(TorchRemoteTest, DamagedFilesAreRefusedNamingThePath) {
  const TorchSaveFile file = StateDict(0, 5, 100);
  {
    std::string bad = file.bytes;
    bad[file.pickle + 3] ^= 0x40;  // data.pkl's CRC-32 catches it
    store_->Put("mem://b/bad/pickle.pt", bad);
    absl::StatusOr<InputModel> model = Read("mem://b/bad/pickle.pt");
    ASSERT_TRUE(absl::IsDataLoss(model.status())) << model.status();
    EXPECT_THAT(model.status().message(), HasSubstr("mem://b/bad/pickle.pt: data.pkl fails"));
  }
  {
    store_->Put("mem://b/bad/cut.pt", file.bytes.substr(0, file.cd_offset + 10));
    absl::StatusOr<InputModel> model = Read("mem://b/bad/cut.pt");
    ASSERT_TRUE(absl::IsDataLoss(model.status())) << model.status();
    EXPECT_THAT(model.status().message(), HasSubstr("mem://b/bad/cut.pt: zip archive"));
    EXPECT_THAT(model.status().message(), HasSubstr("byte offset"));
  }
  {
    // A storage record claimed past the end of the object.
    std::string bad = file.bytes;
    for (int i = 0; i < 4; ++i) bad[file.storage_central[1] + 20 + i] = '\x7f';
    for (int i = 0; i < 4; ++i) bad[file.storage_central[1] + 24 + i] = '\x7f';
    store_->Put("mem://b/bad/size.pt", bad);
    absl::StatusOr<InputModel> model = Read("mem://b/bad/size.pt");
    ASSERT_TRUE(absl::IsDataLoss(model.status())) << model.status();
    EXPECT_THAT(model.status().message(),
                HasSubstr("mem://b/bad/size.pt: zip archive: data of \"archive/data/1\""));
    EXPECT_THAT(model.status().message(), HasSubstr("byte offset"));
  }
  {
    std::string legacy(kLegacyTorchMagic, kLegacyTorchMagicSize);
    legacy += std::string(100, 'x');
    store_->Put("mem://b/bad/legacy.pt", legacy);
    absl::StatusOr<InputModel> model = Read("mem://b/bad/legacy.pt");
    ASSERT_TRUE(absl::IsUnimplemented(model.status())) << model.status();
    EXPECT_THAT(model.status().message(), HasSubstr("mem://b/bad/legacy.pt: the legacy"));
  }
  {
    // A read failing (the store's error) names the file.
    store_->Put("mem://b/bad/fails.pt", file.bytes);
    store_->Fail("mem://b/bad/fails.pt", absl::UnavailableError("HTTP 503 SlowDown"));
    absl::StatusOr<InputModel> model = Read("mem://b/bad/fails.pt");
    ASSERT_TRUE(absl::IsUnavailable(model.status())) << model.status();
    EXPECT_THAT(model.status().message(), HasSubstr("mem://b/bad/fails.pt"));
    EXPECT_THAT(model.status().message(), HasSubstr("503 SlowDown"));
  }
}

TEST_F(TorchRemoteTest, IndexNamingAMissingShard) {
  PutSharded("missing", 2, 3, 10);
  Put("missing/pytorch_model.bin.index.json",
      "{\"weight_map\":{\"layers.0.w\":\"pytorch_model-00001-of-00002.bin\","
      "\"layers.9.w\":\"gone.bin\"}}");
  absl::StatusOr<InputModel> model = Read("mem://b/missing");
  ASSERT_TRUE(absl::IsNotFound(model.status())) << model.status();
  EXPECT_THAT(model.status().message(), HasSubstr("gone.bin"));
}

}  // namespace
}  // namespace reshard
