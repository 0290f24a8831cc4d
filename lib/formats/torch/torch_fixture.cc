#include "lib/formats/torch/torch_fixture.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/testing/test_files.h"
#include "lib/testing/zip_builder.h"

namespace reshard {

std::vector<zip_testing::Entry> TorchSaveEntries(
    const std::string& pickle, const std::vector<std::pair<std::string, std::string>>& storages,
    const std::vector<zip_testing::Entry>& extra) {
  std::vector<zip_testing::Entry> entries = {{"archive/data.pkl", pickle},
                                             {"archive/byteorder", "little"}};
  for (const auto& [key, data] : storages) entries.push_back({"archive/data/" + key, data});
  entries.push_back({"archive/version", "3\n"});
  entries.push_back({"archive/.data/serialization_id", std::string(40, '1')});
  for (const zip_testing::Entry& e : extra) entries.push_back(e);
  return entries;
}

TorchSaveFile BuildTorchSave(const std::string& pickle,
                             const std::vector<std::pair<std::string, std::string>>& storages) {
  zip_testing::Built built = zip_testing::BuildZip(TorchSaveEntries(pickle, storages));
  TorchSaveFile file;
  file.bytes = std::move(built.bytes);
  file.pickle = built.payload[0];
  file.pickle_size = pickle.size();
  for (size_t i = 0; i < storages.size(); ++i) {
    file.storage.push_back(built.payload[2 + i]);
    file.storage_size.push_back(storages[i].second.size());
    file.storage_central.push_back(built.central[2 + i]);
  }
  file.cd_offset = built.cd_offset;
  return file;
}

void WriteFixtureStateDict(PickleWriter& p, const std::vector<std::string>& names) {
  p.BeginDict(true);
  p.String(names.at(0));
  p.Tensor("FloatStorage", "0", 12, {4, 3}, {3, 1});
  p.String(names.at(1));
  p.Tensor("BFloat16Storage", "1", 3, {3}, {1});
  p.String(names.at(2));
  p.Tensor("LongStorage", "2", 2, {2}, {1});
  p.EndDict();
}

std::vector<std::pair<std::string, std::string>> FixtureStateDictStorages(float first_f32) {
  std::vector<std::pair<std::string, std::string>> storages;
  for (FixtureTensor& tensor : ThreeFixtureTensors({"", "", ""}, first_f32)) {
    storages.emplace_back(std::to_string(storages.size()), std::move(tensor.bytes));
  }
  return storages;
}

void WriteFixtureTensor(PickleWriter& p, const FixtureTensor& tensor,
                        std::vector<std::pair<std::string, std::string>>& storages) {
  // The legacy storage class torch.save names for the dtype, and its element size.
  std::pair<const char*, int64_t> storage = {"FloatStorage", 4};
  if (tensor.dtype == DType::kF16) storage = {"HalfStorage", 2};
  if (tensor.dtype == DType::kBF16) storage = {"BFloat16Storage", 2};
  if (tensor.dtype == DType::kI64) storage = {"LongStorage", 8};
  EXPECT_TRUE(tensor.dtype == DType::kF32 || storage.second != 4)
      << tensor.name << ": fixtures write F32, F16, BF16 and I64 tensors";
  std::vector<int64_t> strides(tensor.shape.size(), 1);
  for (size_t i = tensor.shape.size(); i > 1; --i) {
    strides[i - 2] = strides[i - 1] * tensor.shape[i - 1];
  }
  const std::string key = std::to_string(storages.size());
  p.Tensor(storage.first, key, static_cast<int64_t>(tensor.bytes.size()) / storage.second,
           tensor.shape, strides);
  storages.emplace_back(key, tensor.bytes);
}

void WriteTensorDict(PickleWriter& p, const std::vector<FixtureTensor>& tensors,
                     std::vector<std::pair<std::string, std::string>>& storages) {
  p.BeginDict(true);
  for (const FixtureTensor& tensor : tensors) {
    p.String(tensor.name);
    WriteFixtureTensor(p, tensor, storages);
  }
  p.EndDict();
}

TorchSaveFile TorchSaveOf(const std::vector<FixtureTensor>& tensors) {
  PickleWriter p;
  std::vector<std::pair<std::string, std::string>> storages;
  WriteTensorDict(p, tensors, storages);
  return BuildTorchSave(p.Finish(), storages);
}

std::vector<FixtureDamage> TorchSaveDamages(const std::string& file, const TorchSaveFile& archive,
                                            absl::string_view name, uint64_t base,
                                            bool whole_file) {
  using Kind = FixtureDamage::Kind;
  std::vector<FixtureDamage> damages;
  const std::string at = absl::StrCat(file, ": ");
  if (whole_file) damages.push_back({at + "truncated to 0 bytes", file, Kind::kTruncate, 0});
  damages.push_back({at + "truncated inside data.pkl", file, Kind::kTruncate,
                     base + archive.pickle + archive.pickle_size / 2});
  damages.push_back({at + "truncated inside a storage record", file, Kind::kTruncate,
                     base + archive.storage.at(0) + archive.storage_size.at(0) / 2});
  damages.push_back({at + "truncated inside the central directory", file, Kind::kTruncate,
                     base + archive.cd_offset + 10});
  if (whole_file) {
    damages.push_back(
        {at + "one byte short", file, Kind::kTruncate, base + archive.bytes.size() - 1});
  }
  const size_t in_pickle = archive.bytes.find(std::string(name), archive.pickle);
  EXPECT_LT(in_pickle, archive.pickle + archive.pickle_size) << name << " is not in data.pkl";
  damages.push_back({absl::StrCat(at, "flipped byte in data.pkl (in \"", name, "\")"), file,
                     Kind::kFlip, base + in_pickle + name.size() / 2});
  damages.push_back({at + "flipped byte in a storage record's size (central directory)", file,
                     Kind::kFlip, base + archive.storage_central.at(0) + 20});
  damages.push_back({at + "flipped byte in tensor data", file, Kind::kFlip,
                     base + archive.storage.at(0) + 5, /*in_checksummed_data=*/true});
  return damages;
}

BuiltFixture TorchSaveFolderFixture(const std::string& dir, const std::string& file,
                                    const TorchSaveFile& archive, absl::string_view name) {
  BuiltFixture fixture;
  fixture.input = dir;
  fixture.damages = TorchSaveDamages(file, archive, name);
  fixture.damages.push_back({file + ": missing", file, FixtureDamage::Kind::kRemove, 0});
  return fixture;
}

namespace {

// "torch": a single torch.save state dict, model.pt.
BuiltFixture BuildTorchFixture(const std::string& dir) {
  const std::vector<std::string> names = {"embed.weight", "ln.weight", "steps"};
  PickleWriter p;
  WriteFixtureStateDict(p, names);
  const TorchSaveFile archive = BuildTorchSave(p.Finish(), FixtureStateDictStorages());
  WriteAll(dir + "/model.pt", archive.bytes);
  BuiltFixture fixture;
  fixture.input = dir + "/model.pt";
  fixture.expected = ThreeFixtureTensors(names);
  fixture.damages = TorchSaveDamages("model.pt", archive, names[0]);
  // An empty file holds nothing that says torch.save: no format reads it.
  ExpectDamageCode(fixture, "model.pt: truncated to 0 bytes", absl::StatusCode::kInvalidArgument);
  return fixture;
}

const FormatFixtureRegistration register_fixture("torch", BuildTorchFixture);

}  // namespace
}  // namespace reshard
