#include "lib/formats/torch/torch_output.h"

#include <functional>
#include <memory>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/io/crc32.h"

namespace reshard {
namespace {

constexpr uint64_t kAlignment = 64;
constexpr uint64_t kSaturated = 0xFFFFFFFFu;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01

// The legacy storage class torch.save uses for each dtype.
absl::StatusOr<std::string> StorageClass(DType dtype, absl::string_view tensor) {
  switch (dtype) {
    case DType::kF32:
      return std::string("FloatStorage");
    case DType::kF64:
      return std::string("DoubleStorage");
    case DType::kF16:
      return std::string("HalfStorage");
    case DType::kBF16:
      return std::string("BFloat16Storage");
    case DType::kI64:
      return std::string("LongStorage");
    case DType::kI32:
      return std::string("IntStorage");
    case DType::kI16:
      return std::string("ShortStorage");
    case DType::kI8:
      return std::string("CharStorage");
    case DType::kU8:
      return std::string("ByteStorage");
    case DType::kBool:
      return std::string("BoolStorage");
    default:
      return absl::UnimplementedError(absl::StrCat(
          "tensor \"", tensor, "\": writing ", DTypeName(dtype),
          " to a torch file needs UntypedStorage (_rebuild_tensor_v3), which reshard does not "
          "write yet; use --format safetensors"));
  }
}

void Put16(std::string& out, uint16_t v) {
  char b[2];
  absl::little_endian::Store16(b, v);
  out.append(b, 2);
}
void Put32(std::string& out, uint32_t v) {
  char b[4];
  absl::little_endian::Store32(b, v);
  out.append(b, 4);
}
void Put64(std::string& out, uint64_t v) {
  char b[8];
  absl::little_endian::Store64(b, v);
  out.append(b, 8);
}

// One zip record and where it lies in the file.
struct Record {
  std::string name;  // "<top>/data/0"
  uint64_t header_offset = 0;
  uint64_t size = 0;
  bool zip64 = false;  // the local header carries a ZIP64 extra (24-byte data descriptor)
  int tensor = -1;     // data of this layout tensor, or literal `bytes`
  std::string bytes;
  uint32_t crc = 0;  // literal records only; tensors' come from the Executor
};

std::string LocalHeader(const Record& r, uint64_t data_offset) {
  std::string h;
  Put32(h, 0x04034b50);
  Put16(h, r.zip64 ? 45 : 20);
  Put16(h, r.size > 0 ? 0x0808 : 0x0800);  // sizes in the data descriptor; UTF-8 names
  Put16(h, 0);                             // stored
  Put16(h, 0);
  Put16(h, kDosDate);
  Put32(h, 0);  // CRC and sizes are in the data descriptor
  Put32(h, 0);
  Put32(h, 0);
  const uint64_t zip64_length =
      r.zip64 ? 4 + (r.size >= kSaturated ? 16 : 0) + (r.header_offset >= kSaturated ? 8 : 0) : 0;
  const uint64_t start = r.header_offset + 30 + r.name.size() + zip64_length + 4;
  const uint64_t pad = data_offset - start;
  Put16(h, static_cast<uint16_t>(r.name.size()));
  Put16(h, static_cast<uint16_t>(zip64_length + 4 + pad));
  h += r.name;
  if (r.zip64) {
    Put16(h, 0x0001);
    Put16(h, static_cast<uint16_t>(zip64_length - 4));
    if (r.size >= kSaturated) {
      Put64(h, r.size);
      Put64(h, 0);
    }
    if (r.header_offset >= kSaturated) Put64(h, r.header_offset);
  }
  Put16(h, 0x4246);  // "FB": torch's padding field
  Put16(h, static_cast<uint16_t>(pad));
  h.append(pad, 'Z');
  return h;
}

std::string DataDescriptor(const Record& r, uint32_t crc) {
  std::string d;
  Put32(d, 0x08074b50);
  Put32(d, crc);
  if (r.zip64) {
    Put64(d, r.size);
    Put64(d, r.size);
  } else {
    Put32(d, static_cast<uint32_t>(r.size));
    Put32(d, static_cast<uint32_t>(r.size));
  }
  return d;
}

uint64_t DescriptorSize(const Record& r) { return r.size == 0 ? 0 : (r.zip64 ? 24 : 16); }

// Central directory, ZIP64 end record, ZIP64 locator and classic end record.
std::string EndRecords(const std::vector<Record>& records, const TensorChecksums& crcs,
                       uint64_t cd_offset) {
  std::string cd;
  for (const Record& r : records) {
    const bool big_size = r.size >= kSaturated;
    const bool big_offset = r.header_offset >= kSaturated;
    const uint16_t extra =
        (big_size || big_offset) ? 4 + (big_size ? 16 : 0) + (big_offset ? 8 : 0) : 0;
    Put32(cd, 0x02014b50);
    Put16(cd, 0x031E);
    Put16(cd, extra ? 45 : 20);
    Put16(cd, r.size > 0 ? 0x0808 : 0x0800);
    Put16(cd, 0);
    Put16(cd, 0);
    Put16(cd, kDosDate);
    Put32(cd, r.tensor >= 0 ? crcs[r.tensor] : r.crc);
    Put32(cd, static_cast<uint32_t>(big_size ? kSaturated : r.size));
    Put32(cd, static_cast<uint32_t>(big_size ? kSaturated : r.size));
    Put16(cd, static_cast<uint16_t>(r.name.size()));
    Put16(cd, extra);
    Put16(cd, 0);  // comment
    Put16(cd, 0);  // disk
    Put16(cd, 0);  // internal attributes
    Put32(cd, 0);  // external attributes
    Put32(cd, static_cast<uint32_t>(big_offset ? kSaturated : r.header_offset));
    cd += r.name;
    if (extra) {
      Put16(cd, 0x0001);
      Put16(cd, static_cast<uint16_t>(extra - 4));
      if (big_size) {
        Put64(cd, r.size);
        Put64(cd, r.size);
      }
      if (big_offset) Put64(cd, r.header_offset);
    }
  }
  const uint64_t zip64_end = cd_offset + cd.size();
  std::string end = cd;
  Put32(end, 0x06064b50);
  Put64(end, 44);
  Put16(end, 0x031E);
  Put16(end, 45);
  Put32(end, 0);
  Put32(end, 0);
  Put64(end, records.size());
  Put64(end, records.size());
  Put64(end, cd.size());
  Put64(end, cd_offset);
  Put32(end, 0x07064b50);  // locator
  Put32(end, 0);
  Put64(end, zip64_end);
  Put32(end, 1);
  Put32(end, 0x06054b50);  // classic end
  Put16(end, 0);
  Put16(end, 0);
  Put16(end, static_cast<uint16_t>(std::min<uint64_t>(records.size(), 0xFFFF)));
  Put16(end, static_cast<uint16_t>(std::min<uint64_t>(records.size(), 0xFFFF)));
  Put32(end, static_cast<uint32_t>(std::min<uint64_t>(cd.size(), kSaturated)));
  Put32(end, static_cast<uint32_t>(std::min<uint64_t>(cd_offset, kSaturated)));
  Put16(end, 0);
  return end;
}

// A global's module and name are lines of the GLOBAL opcode.
absl::Status CheckGlobal(const StructureNode& node) {
  if (node.module.empty() || node.name.empty() || absl::StrContains(node.module, '\n') ||
      absl::StrContains(node.name, '\n')) {
    return absl::InvalidArgumentError(
        absl::StrCat("global \"", absl::CEscape(node.module), ".", absl::CEscape(node.name),
                     "\" cannot be pickled (empty, or holds a newline)"));
  }
  return absl::OkStatus();
}

// Writes the input's nesting with its tensors (looked up by name in `tensor_index`) and the
// Python objects it carries.
absl::Status WriteStructure(const StructureNode& node,
                            const absl::flat_hash_map<std::string, int>& tensor_index,
                            const std::function<absl::Status(int)>& write_tensor,
                            PickleWriter& pickle) {
  using Kind = StructureNode::Kind;
  auto write_all = [&](const std::vector<StructureNode>& nodes) -> absl::Status {
    for (const StructureNode& child : nodes) {
      RETURN_IF_ERROR(WriteStructure(child, tensor_index, write_tensor, pickle));
    }
    return absl::OkStatus();
  };
  auto write_entries = [&]() -> absl::Status {
    if (node.keys.size() != node.values.size()) {
      return absl::InternalError("structure has keys and values of different counts");
    }
    for (size_t i = 0; i < node.keys.size(); ++i) {
      RETURN_IF_ERROR(WriteStructure(node.keys[i], tensor_index, write_tensor, pickle));
      RETURN_IF_ERROR(WriteStructure(node.values[i], tensor_index, write_tensor, pickle));
    }
    return absl::OkStatus();
  };
  auto write_state = [&]() -> absl::Status {
    if (node.state.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(WriteStructure(node.state[0], tensor_index, write_tensor, pickle));
    pickle.Build();
    return absl::OkStatus();
  };
  switch (node.kind) {
    case Kind::kNone:
      pickle.None();
      return absl::OkStatus();
    case Kind::kBool:
      pickle.Bool(node.boolean);
      return absl::OkStatus();
    case Kind::kInt:
      pickle.Int(node.integer);
      return absl::OkStatus();
    case Kind::kFloat:
      pickle.Float(node.real);
      return absl::OkStatus();
    case Kind::kString:
      pickle.String(node.text);
      return absl::OkStatus();
    case Kind::kBytes:
      pickle.Bytes(node.text);
      return absl::OkStatus();
    case Kind::kBigInt:
      pickle.BigInt(node.text);
      return absl::OkStatus();
    case Kind::kTensor: {
      auto it = tensor_index.find(node.text);
      if (it == tensor_index.end()) {
        return absl::InternalError(absl::StrCat("tensor \"", node.text, "\" is not in the file"));
      }
      return write_tensor(it->second);
    }
    case Kind::kDict:
      pickle.BeginDict(node.ordered);
      RETURN_IF_ERROR(write_entries());
      pickle.EndDict();
      return write_state();
    case Kind::kList:
    case Kind::kTuple:
      node.kind == Kind::kList ? pickle.BeginList() : pickle.BeginTuple();
      RETURN_IF_ERROR(write_all(node.items));
      node.kind == Kind::kList ? pickle.EndList() : pickle.EndTuple();
      return absl::OkStatus();
    case Kind::kGlobal:
      RETURN_IF_ERROR(CheckGlobal(node));
      pickle.Global(node.module, node.name);
      return absl::OkStatus();
    case Kind::kObject:
      // As Python's pickler writes an object from its __reduce__: the call, then the items and
      // entries it is given, then its state.
      RETURN_IF_ERROR(CheckGlobal(node));
      pickle.Global(node.module, node.name);
      pickle.BeginTuple();
      RETURN_IF_ERROR(write_all(node.args));
      pickle.EndTuple();
      node.construction == StructureNode::Construction::kNewObj ? pickle.NewObj() : pickle.Reduce();
      if (!node.items.empty()) {
        pickle.BeginItems();
        RETURN_IF_ERROR(write_all(node.items));
        pickle.EndAppends();
      }
      if (!node.keys.empty()) {
        pickle.BeginItems();
        RETURN_IF_ERROR(write_entries());
        pickle.EndSetItems();
      }
      return write_state();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> PickleStructure(const StructureNode& node) {
  PickleWriter pickle;
  auto no_tensor = [](int) -> absl::Status { return absl::InternalError("no tensor is indexed"); };
  const absl::flat_hash_map<std::string, int> no_tensors;
  absl::Status status = WriteStructure(node, no_tensors, no_tensor, pickle);
  if (!status.ok() && status.code() == absl::StatusCode::kInternal) {
    return absl::InvalidArgumentError(
        absl::StrCat("the value holds a tensor, which a pickled value cannot: ", status.message()));
  }
  RETURN_IF_ERROR(status);
  return pickle.Finish();
}

OutputNaming TorchOutput::naming() const {
  OutputNaming naming;
  naming.shard_file = [](int index, int count) {
    if (count == 1) return std::string("pytorch_model.bin");
    return absl::StrFormat("pytorch_model-%05d-of-%05d.bin", index + 1, count);
  };
  naming.part_file = [](int rank, int) { return absl::StrCat("model_part-", rank, ".pt"); };
  return naming;
}

absl::StatusOr<FileFraming> TorchOutput::Frame(const OutputFileLayout& file) const {
  // torch names the top folder after the file (without its extension).
  std::string top = file.name.substr(file.name.rfind('/') + 1);
  top = top.substr(0, top.rfind('.'));
  for (char c : top) {
    if (static_cast<unsigned char>(c) >= 0x80 || c == '/') top = "archive";
  }
  // Storages: one per stored tensor, keys "0", "1", ... in file order; aliases share theirs.
  std::vector<std::string> keys(file.tensors.size());
  std::vector<int> stored;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const OutputTensor& tensor = file.tensors[i];
    if (tensor.alias_of >= 0) continue;
    keys[i] = absl::StrCat(stored.size());
    stored.push_back(static_cast<int>(i));
  }
  PickleWriter pickle;
  auto write_tensor = [&](int index) -> absl::Status {
    const OutputTensor& tensor = file.tensors[index];
    const int owner = tensor.alias_of >= 0 ? tensor.alias_of : index;
    ASSIGN_OR_RETURN(std::string storage_class, StorageClass(tensor.dtype, tensor.name));
    pickle.Tensor(storage_class, keys[owner], NumElementsUnchecked(tensor.shape()), tensor.shape(),
                  RowMajorStrides(tensor.shape()));
    return absl::OkStatus();
  };
  absl::flat_hash_map<std::string, int> tensor_index;
  for (size_t i = 0; i < file.tensors.size(); ++i) tensor_index[file.tensors[i].name] = i;
  if (file.structure != nullptr) {
    RETURN_IF_ERROR(WriteStructure(*file.structure, tensor_index, write_tensor, pickle), file.name);
  } else {
    pickle.BeginDict(/*ordered=*/true);
    for (size_t i = 0; i < file.tensors.size(); ++i) {
      pickle.String(file.tensors[i].name);
      RETURN_IF_ERROR(write_tensor(static_cast<int>(i)), file.name);
    }
    pickle.EndDict();
  }

  // Records in torch.save's order, laid out front to back.
  auto records = std::make_shared<std::vector<Record>>();
  records->push_back({absl::StrCat(top, "/data.pkl"), 0, 0, false, -1, pickle.Finish()});
  records->push_back({absl::StrCat(top, "/byteorder"), 0, 0, false, -1, "little"});
  for (int index : stored) {
    Record r;
    r.name = absl::StrCat(top, "/data/", keys[index]);
    r.tensor = index;
    r.size = file.tensors[index].bytes();
    records->push_back(std::move(r));
  }
  records->push_back({absl::StrCat(top, "/version"), 0, 0, false, -1, "3\n"});
  FileFraming framing;
  framing.needs_crc32 = true;
  uint64_t cursor = 0;
  for (size_t i = 0; i < records->size(); ++i) {
    Record& r = (*records)[i];
    if (r.tensor < 0) {
      r.size = r.bytes.size();
      r.crc = Crc32(0, r.bytes.data(), r.bytes.size());
    }
    r.header_offset = cursor;
    r.zip64 = r.size >= kSaturated || cursor >= kSaturated;
    uint64_t start = cursor + 30 + r.name.size() + 4;
    if (r.zip64) start += 4 + (r.size >= kSaturated ? 16 : 0) + (cursor >= kSaturated ? 8 : 0);
    const uint64_t data_offset = (start + kAlignment - 1) / kAlignment * kAlignment;
    std::string header = LocalHeader(r, data_offset);
    if (r.tensor < 0) {
      header += r.bytes;
      if (r.size > 0) header += DataDescriptor(r, r.crc);
      framing.segments.push_back({FramingSegment::Kind::kBytes, std::move(header)});
    } else {
      framing.segments.push_back({FramingSegment::Kind::kBytes, std::move(header)});
      framing.segments.push_back({FramingSegment::Kind::kTensor, "", r.tensor});
      if (r.size > 0) {
        FramingSegment descriptor;
        descriptor.kind = FramingSegment::Kind::kDeferred;
        descriptor.size = DescriptorSize(r);
        descriptor.deferred = static_cast<int>(i);
        framing.segments.push_back(std::move(descriptor));
      }
    }
    cursor = data_offset + r.size + DescriptorSize(r);
  }
  const uint64_t cd_offset = cursor;
  FramingSegment end;
  end.kind = FramingSegment::Kind::kDeferred;
  end.deferred = -1;
  end.size = EndRecords(*records, TensorChecksums(file.tensors.size(), 0), cd_offset).size();
  framing.segments.push_back(std::move(end));
  framing.deferred = [records, cd_offset](int deferred, const TensorChecksums& crcs) {
    if (deferred < 0) return EndRecords(*records, crcs, cd_offset);
    const Record& r = (*records)[deferred];
    return DataDescriptor(r, crcs[r.tensor]);
  };
  return framing;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TorchOutput::CompanionFiles(
    const TargetLayout& layout) const {
  std::vector<std::pair<std::string, std::string>> files;
  if (layout.kind != TargetLayout::Kind::kConsolidated || layout.files.size() < 2) return files;
  files.emplace_back(kTorchIndexName, HuggingFaceIndexJson(layout));
  return files;
}

namespace {
const OutputFormatRegistration<TorchOutput> register_output;
}  // namespace

}  // namespace reshard
