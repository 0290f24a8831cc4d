// torch.save archives for tests (the fixture of the "torch" input format, and the building
// block of the fixtures of the formats made of torch.save files: DeepSpeed, DCP, Megatron).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_TORCH_TORCH_FIXTURE_H_
#define RESHARD_LIB_FORMATS_TORCH_TORCH_FIXTURE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/testing/zip_builder.h"

namespace reshard {

// The records torch.save writes, in its order: data.pkl, byteorder, data/<key> for each storage
// (key, bytes), version, .data/serialization_id; `extra` entries are appended.
std::vector<zip_testing::Entry> TorchSaveEntries(
    const std::string& pickle, const std::vector<std::pair<std::string, std::string>>& storages,
    const std::vector<zip_testing::Entry>& extra = {});

// A torch.save archive as torch writes it (TorchSaveEntries laid out by
// zip_testing::BuildZip: stored, 64-byte aligned, with CRC-32s), and where its parts are.
struct TorchSaveFile {
  std::string bytes;
  uint64_t pickle = 0;  // data.pkl's payload
  uint64_t pickle_size = 0;
  std::vector<uint64_t> storage;  // each storage record's payload, in the order given
  std::vector<uint64_t> storage_size;
  std::vector<uint64_t> storage_central;  // each storage record's central directory record
  uint64_t cd_offset = 0;                 // the central directory
};

TorchSaveFile BuildTorchSave(const std::string& pickle,
                             const std::vector<std::pair<std::string, std::string>>& storages);

// ThreeFixtureTensors (format_fixture.h), each in a storage record of its own: F32 [4, 3] (key
// "0"), BF16 [3] ("1") and I64 [2] ("2"), under the names given.
// Writes the OrderedDict of the three tensors into `p`.
void WriteFixtureStateDict(PickleWriter& p, const std::vector<std::string>& names);
// Its storage records (key, bytes): the bytes of ThreeFixtureTensors(names, first_f32).
std::vector<std::pair<std::string, std::string>> FixtureStateDictStorages(float first_f32 = 1.5f);

// `tensor` (F32, F16, BF16 or I64) written into `p` as a row-major tensor whose storage record,
// holding its bytes, is appended to `storages` under the next key ("0", "1", ...).
void WriteFixtureTensor(PickleWriter& p, const FixtureTensor& tensor,
                        std::vector<std::pair<std::string, std::string>>& storages);
// The OrderedDict of `tensors` by name, each written by WriteFixtureTensor.
void WriteTensorDict(PickleWriter& p, const std::vector<FixtureTensor>& tensors,
                     std::vector<std::pair<std::string, std::string>>& storages);
// A torch.save archive of the OrderedDict of `tensors` (a state dict).
TorchSaveFile TorchSaveOf(const std::vector<FixtureTensor>& tensors);

// The damages a torch.save archive in `file` (relative to the fixture folder) can suffer; the
// archive starts at byte `base` of the file (a DCP data file holds several), and `whole_file`
// says it ends where the file ends. Truncations inside data.pkl, the first storage record and
// the central directory; flipped bytes in `name` (a string in data.pkl such as a tensor name:
// data.pkl's CRC-32 must catch it), in the central directory's compressed-size field of the
// first storage record, and in that record's data (its CRC-32 must catch it when converting).
std::vector<FixtureDamage> TorchSaveDamages(const std::string& file, const TorchSaveFile& archive,
                                            absl::string_view name, uint64_t base = 0,
                                            bool whole_file = true);

// A fixture whose input is the folder `dir` and whose one torch.save file is `file` (relative to
// `dir`, already written): the damages of TorchSaveDamages, and the file missing.
BuiltFixture TorchSaveFolderFixture(const std::string& dir, const std::string& file,
                                    const TorchSaveFile& archive, absl::string_view name);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_TORCH_FIXTURE_H_
