#include "lib/plan/layout_builders.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"

namespace reshard {

absl::StatusOr<DTypePolicy> ParseDTypePolicy(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "keep" || lower == "auto") return DTypePolicy::kKeep;
  if (lower == "fp32" || lower == "f32" || lower == "float32") return DTypePolicy::kF32;
  if (lower == "bf16" || lower == "bfloat16") return DTypePolicy::kBF16;
  if (lower == "fp16" || lower == "f16" || lower == "float16" || lower == "half") {
    return DTypePolicy::kF16;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", text, "\"; expected keep, fp32, bf16 or fp16"));
}

absl::string_view DTypePolicyName(DTypePolicy policy) {
  switch (policy) {
    case DTypePolicy::kKeep:
      return "keep";
    case DTypePolicy::kF32:
      return "fp32";
    case DTypePolicy::kBF16:
      return "bf16";
    case DTypePolicy::kF16:
      return "fp16";
  }
  return "keep";
}

DType ApplyDTypePolicy(DTypePolicy policy, DType dtype) {
  if (!IsConvertibleFloat(dtype)) return dtype;
  switch (policy) {
    case DTypePolicy::kKeep:
      return dtype;
    case DTypePolicy::kF32:
      return DType::kF32;
    case DTypePolicy::kBF16:
      return DType::kBF16;
    case DTypePolicy::kF16:
      return DType::kF16;
  }
  return dtype;
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[split])) || trimmed[split] == '.')) {
    ++split;
  }
  absl::string_view number = trimmed.substr(0, split);
  std::string unit = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(trimmed.substr(split)));
  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"KIB", 1024.0},
                                    {"MIB", 1048576.0},
                                    {"GIB", 1073741824.0},
                                    {"TIB", 1099511627776.0},
                                    {"K", 1e3},
                                    {"M", 1e6},
                                    {"G", 1e9}};
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size \"", text, "\"; expected e.g. 5GB, 500MB, 2GiB, 1048576"));
  }
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      double bytes = std::floor(value * u.factor);
      if (bytes < 1 || bytes > 1.8e19) {
        return absl::InvalidArgumentError(absl::StrCat("size \"", text, "\" is out of range"));
      }
      return static_cast<uint64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid size unit in \"", text,
                                                 "\"; use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"));
}

std::vector<std::vector<OutputTensor>> PackShards(std::vector<OutputTensor> tensors,
                                                  uint64_t max_shard_size) {
  std::vector<std::vector<OutputTensor>> shards;
  std::vector<OutputTensor> current;
  uint64_t current_size = 0;
  for (OutputTensor& out : tensors) {
    const uint64_t size = out.bytes();
    if (size > max_shard_size) {
      shards.push_back({std::move(out)});
      continue;
    }
    if (current_size + size > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current_size += size;
    current.push_back(std::move(out));
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

absl::StatusOr<TargetLayout> BuildConsolidateLayout(const Catalog& catalog, DTypePolicy dtype,
                                                    uint64_t max_shard_size,
                                                    const OutputNaming& naming, bool dedupe_tied) {
  if (max_shard_size == 0) return absl::InvalidArgumentError("max shard size must be positive");
  const std::vector<int> aliases =
      dedupe_tied ? FindAliases(catalog) : std::vector<int>(catalog.tensors.size(), -1);
  std::vector<OutputTensor> stored;
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    if (aliases[i] >= 0) continue;  // placed with the tensor it aliases, below
    const CatalogTensor& tensor = catalog.tensors[i];
    stored.push_back({tensor.name, static_cast<int>(i), Box::Full(tensor.shape),
                      ApplyDTypePolicy(dtype, tensor.dtype)});
  }
  std::vector<std::vector<OutputTensor>> shards = PackShards(std::move(stored), max_shard_size);
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    if (aliases[i] < 0) continue;
    for (std::vector<OutputTensor>& shard : shards) {
      auto it = std::find_if(shard.begin(), shard.end(),
                             [&](const OutputTensor& t) { return t.source == aliases[i]; });
      if (it == shard.end()) continue;
      OutputTensor alias = *it;
      alias.name = catalog.tensors[i].name;
      alias.source = static_cast<int>(i);
      alias.alias_of = static_cast<int>(it - shard.begin());
      shard.push_back(std::move(alias));
      break;
    }
  }
  TargetLayout layout;
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    OutputFileLayout file;
    file.name = naming.shard_file(i, count);
    file.tensors = std::move(shards[i]);
    layout.files.push_back(std::move(file));
  }
  if (count == 1) layout.files[0].structure = catalog.structure;  // the input's names, whole
  return layout;
}

namespace {

// A split of `rows` rows into `parts` slices must keep the rule's units whole (Megatron's
// attention heads in query_key_value): refused, naming the counts that would work, otherwise.
absl::Status CheckWholeUnits(const CatalogTensor& tensor, const PartitionRule& rule, int dim,
                             int64_t rows, int parts) {
  if (rule.unit <= 1) return absl::OkStatus();
  if (rows % rule.unit != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name, "\": dimension ", dim, " has ", rows,
                     " rows, not a whole number of the rule's units of ", rule.unit,
                     " rows (rule \"", rule.pattern, "\")"));
  }
  const int64_t units = rows / rule.unit;
  if (units % parts != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name, "\": its ", units, " units of ", rule.unit,
                     " rows along dimension ", dim,
                     " (attention heads or head groups, for Megatron's "
                     "query_key_value) cannot be shared evenly by ",
                     parts, " parts: a part would hold a fraction of one (rule \"", rule.pattern,
                     "\"); use a part count that divides ", units));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TargetLayout> BuildSplitLayout(const Catalog& catalog, const PartitionRules& rules,
                                              int parts, DTypePolicy dtype,
                                              const OutputNaming& naming) {
  if (parts < 1) return absl::InvalidArgumentError("the number of parts must be at least 1");
  if (rules.empty()) {
    return absl::InvalidArgumentError("splitting into parts needs partition rules (--rules FILE)");
  }
  TargetLayout layout;
  layout.kind = TargetLayout::Kind::kParts;
  layout.files.resize(parts);
  for (int rank = 0; rank < parts; ++rank) {
    layout.files[rank].name = naming.part_file(rank, parts);
    layout.files[rank].metadata = {{"reshard_part", absl::StrCat(rank)},
                                   {"reshard_parts", absl::StrCat(parts)}};
    layout.files[rank].structure = catalog.structure;  // every part has the input's names
  }
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    const CatalogTensor& tensor = catalog.tensors[i];
    ASSIGN_OR_RETURN(const PartitionRule* rule, rules.Match(tensor.name));
    const DType out_dtype = ApplyDTypePolicy(dtype, tensor.dtype);
    if (rule->replicate) {
      for (int rank = 0; rank < parts; ++rank) {
        layout.files[rank].tensors.push_back(
            {tensor.name, static_cast<int>(i), Box::Full(tensor.shape), out_dtype});
      }
      continue;
    }
    if (rule->fused > 1) {
      // Viewed as [..., K, G, ...]: every part gets [all K blocks, its G/parts rows].
      ASSIGN_OR_RETURN(int dim, ResolveSplitDim(*rule, tensor.shape.size() - 1, tensor.name));
      const int view_dim = dim + 1;
      if (tensor.shape[dim] != rule->fused || tensor.shape[view_dim] % parts != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", tensor.name, "\": ", rule->fused, " fused blocks of ",
            tensor.shape[view_dim], " rows along dimension ", dim, " are not divisible into ",
            parts, " parts (rule \"", rule->pattern, "\")"));
      }
      const int64_t slice = tensor.shape[view_dim] / parts;
      RETURN_IF_ERROR(CheckWholeUnits(tensor, *rule, dim, tensor.shape[view_dim], parts));
      Shape written = tensor.shape;
      written.erase(written.begin() + dim);
      written[dim] = rule->fused * slice;
      for (int rank = 0; rank < parts; ++rank) {
        Box region = Box::Full(tensor.shape);
        region.origin[view_dim] = rank * slice;
        region.extent[view_dim] = slice;
        OutputTensor out{tensor.name, static_cast<int>(i), region, out_dtype};
        out.written_shape = written;
        layout.files[rank].tensors.push_back(std::move(out));
      }
      continue;
    }
    ASSIGN_OR_RETURN(int dim, ResolveSplitDim(*rule, tensor.shape.size(), tensor.name));
    if (tensor.shape[dim] % parts != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor.name, "\" of shape ", ShapeToString(tensor.shape),
                       ": dimension ", dim, " (size ", tensor.shape[dim],
                       ") is not divisible into ", parts, " parts (rule \"", rule->pattern, "\")"));
    }
    const int64_t slice = tensor.shape[dim] / parts;
    RETURN_IF_ERROR(CheckWholeUnits(tensor, *rule, dim, tensor.shape[dim], parts));
    for (int rank = 0; rank < parts; ++rank) {
      Box region = Box::Full(tensor.shape);
      region.origin[dim] = rank * slice;
      region.extent[dim] = slice;
      layout.files[rank].tensors.push_back({tensor.name, static_cast<int>(i), region, out_dtype});
    }
  }
  return layout;
}

namespace {

// Calls `emit(block, sub_piece)` for the part of `piece` inside each block of `block_size` rows
// along `dim`; sub_piece keeps the piece's coordinates and has its byte offset moved.
template <typename Emit>
void ForEachBlock(const SourcePiece& piece, int dim, int64_t block_size, DType dtype, Emit emit) {
  const int64_t begin = piece.box.origin[dim];
  const int64_t end = begin + piece.box.extent[dim];
  for (int64_t block = begin / block_size; block * block_size < end; ++block) {
    const int64_t from = std::max(begin, block * block_size);
    const int64_t to = std::min(end, (block + 1) * block_size);
    SourcePiece sub = piece;
    sub.box.origin[dim] = from;
    sub.box.extent[dim] = to - from;
    sub.byte_offset +=
        static_cast<uint64_t>((from - begin) * piece.strides[dim]) * DTypeSize(dtype);
    emit(block, std::move(sub));
  }
}

}  // namespace

absl::StatusOr<CatalogTensor> ViewAsBlocks(const CatalogTensor& tensor, int dim, int64_t blocks) {
  if (dim < 0 || dim >= static_cast<int>(tensor.shape.size()) || blocks < 1 ||
      tensor.shape[dim] % blocks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor.name, "\" of shape ", ShapeToString(tensor.shape), ": dimension ",
        dim, " does not hold ", blocks, " equal blocks"));
  }
  const int64_t block = tensor.shape[dim] / blocks;
  CatalogTensor viewed = tensor;
  viewed.pieces.clear();
  viewed.replicas.clear();
  for (const SourcePiece& piece : tensor.pieces) {
    ForEachBlock(piece, dim, block, tensor.dtype, [&](int64_t j, SourcePiece sub) {
      // [.., rows, ..] -> [.., 1 block, rows within the block, ..]
      sub.box.origin.insert(sub.box.origin.begin() + dim, j);
      sub.box.origin[dim + 1] -= j * block;
      sub.box.extent.insert(sub.box.extent.begin() + dim, 1);
      sub.strides.insert(sub.strides.begin() + dim, sub.strides[dim] * block);
      viewed.pieces.push_back(std::move(sub));
    });
  }
  viewed.shape.insert(viewed.shape.begin() + dim, blocks);
  viewed.shape[dim + 1] = block;
  return viewed;
}

absl::StatusOr<CatalogTensor> ViewPermuted(const CatalogTensor& tensor,
                                           const std::vector<int>& order) {
  const size_t rank = tensor.shape.size();
  std::vector<bool> seen(rank, false);
  bool valid = order.size() == rank;
  for (size_t d = 0; valid && d < rank; ++d) {
    valid = order[d] >= 0 && static_cast<size_t>(order[d]) < rank && !seen[order[d]];
    if (valid) seen[order[d]] = true;
  }
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", tensor.name, "\" of shape ", ShapeToString(tensor.shape),
                     ": dimension order [", absl::StrJoin(order, ", "),
                     "] is not a permutation of its ", rank, " dimensions"));
  }
  auto permute = [&](const std::vector<int64_t>& values) {
    std::vector<int64_t> permuted(rank);
    for (size_t d = 0; d < rank; ++d) permuted[d] = values[order[d]];
    return permuted;
  };
  CatalogTensor viewed = tensor;
  viewed.shape = permute(tensor.shape);
  for (std::vector<SourcePiece>* pieces : {&viewed.pieces, &viewed.replicas}) {
    for (SourcePiece& piece : *pieces) {
      piece.box.origin = permute(piece.box.origin);
      piece.box.extent = permute(piece.box.extent);
      piece.strides = permute(piece.strides);
    }
  }
  return viewed;
}

absl::StatusOr<CatalogTensor> ViewSubTensorsByPart(const CatalogTensor& tensor, int dim,
                                                   const std::vector<int64_t>& sizes, int parts) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor.name, "\" of shape ", ShapeToString(tensor.shape), ", sub-tensors of ",
        absl::StrJoin(sizes, ", "), " along dimension ", dim, ": ", why));
  };
  if (dim < 0 || dim >= static_cast<int>(tensor.shape.size()) || parts < 1) {
    return refuse("no such dimension");
  }
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0 || size % parts != 0) {
      return refuse(absl::StrCat("a split into ", parts, " parts would cut a sub-tensor of ", size,
                                 " rows unevenly"));
    }
    total += size;
  }
  if (total != tensor.shape[dim]) {
    return refuse(absl::StrCat("they add up to ", total, " rows, not ", tensor.shape[dim]));
  }
  // Slice t of sub-tensor j, rows [start, start + rows) of `tensor`, becomes rows
  // [t * total / parts + start / parts, ...) of the view.
  struct Move {
    int64_t start, rows, shift;
  };
  std::vector<Move> moves;
  int64_t start = 0;
  for (int64_t size : sizes) {
    const int64_t rows = size / parts;
    for (int64_t t = 0; t < parts; ++t) {
      const int64_t from = start + t * rows;
      moves.push_back({from, rows, t * (total / parts) + start / parts - from});
    }
    start += size;
  }
  CatalogTensor viewed = tensor;
  for (std::vector<SourcePiece>* pieces : {&viewed.pieces, &viewed.replicas}) {
    std::vector<SourcePiece> moved;
    for (const SourcePiece& piece : *pieces) {
      const int64_t begin = piece.box.origin[dim];
      const int64_t end = begin + piece.box.extent[dim];
      for (const Move& move : moves) {
        const int64_t from = std::max(begin, move.start);
        const int64_t to = std::min(end, move.start + move.rows);
        if (from >= to) continue;
        SourcePiece sub = piece;
        sub.box.origin[dim] = from + move.shift;
        sub.box.extent[dim] = to - from;
        sub.byte_offset +=
            static_cast<uint64_t>((from - begin) * piece.strides[dim]) * DTypeSize(tensor.dtype);
        moved.push_back(std::move(sub));
      }
    }
    *pieces = std::move(moved);
  }
  return viewed;
}

absl::StatusOr<Catalog> ViewFusedTensors(const Catalog& catalog, const PartitionRules& rules) {
  Catalog viewed = catalog;
  for (CatalogTensor& tensor : viewed.tensors) {
    ASSIGN_OR_RETURN(const PartitionRule* rule, rules.Match(tensor.name));
    if (rule->replicate || rule->fused <= 1) continue;
    ASSIGN_OR_RETURN(int dim, ResolveSplitDim(*rule, tensor.shape.size(), tensor.name));
    if (tensor.shape[dim] % rule->fused != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor.name, "\": dimension ", dim, " (size ",
                       tensor.shape[dim], ") does not hold ", rule->fused, " equal fused blocks"));
    }
    std::vector<SourcePiece> replicas = std::move(tensor.replicas);
    ASSIGN_OR_RETURN(tensor, ViewAsBlocks(tensor, dim, rule->fused));
    tensor.replicas = std::move(replicas);
  }
  viewed.Reindex();
  return viewed;
}

absl::StatusOr<Catalog> MergeParts(std::vector<Catalog> parts, const PartitionRules& rules,
                                   const std::vector<std::string>& part_names) {
  if (parts.empty()) return absl::InvalidArgumentError("no model-parallel parts to merge");
  if (parts.size() == 1) return std::move(parts[0]);
  if (rules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the input is ", parts.size(),
                     " model-parallel parts (every file holds the same ", parts[0].tensors.size(),
                     " tensor names); merging them needs partition rules: pass "
                     "--rules FILE"));
  }
  auto part_name = [&](size_t p) {
    return p < part_names.size() ? part_names[p] : absl::StrCat("part ", p);
  };
  for (Catalog& part : parts) part.Reindex();
  // Every part holds exactly the names of part 0.
  for (size_t p = 1; p < parts.size(); ++p) {
    for (const CatalogTensor& tensor : parts[0].tensors) {
      if (parts[p].Find(tensor.name) < 0) {
        return absl::InvalidArgumentError(absl::StrCat(part_name(p), " (part ", p, " of ",
                                                       parts.size(), ") lacks tensor \"",
                                                       tensor.name, "\" that part 0 holds"));
      }
    }
    if (parts[p].tensors.size() != parts[0].tensors.size()) {
      for (const CatalogTensor& tensor : parts[p].tensors) {
        if (parts[0].Find(tensor.name) < 0) {
          return absl::InvalidArgumentError(absl::StrCat(part_name(p), " (part ", p,
                                                         ") holds tensor \"", tensor.name,
                                                         "\" that part 0 lacks"));
        }
      }
    }
  }
  Catalog merged;
  merged.format = parts[0].format;
  merged.metadata = parts[0].metadata;
  merged.structure = parts[0].structure;  // non-tensor entries come from part 0
  merged.other_entries = parts[0].other_entries;
  merged.metadata.erase("reshard_part");
  merged.metadata.erase("reshard_parts");
  std::vector<int> file_base(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    file_base[p] = static_cast<int>(merged.files.size());
    for (const SourceFile& file : parts[p].files) merged.files.push_back(file);
  }
  for (const CatalogTensor& first : parts[0].tensors) {
    ASSIGN_OR_RETURN(const PartitionRule* rule, rules.Match(first.name));
    CatalogTensor global{first.name, first.dtype, first.shape, {}};
    int dim = -1;
    if (!rule->replicate) {
      ASSIGN_OR_RETURN(dim, ResolveSplitDim(*rule, first.shape.size(), first.name));
      global.shape[dim] = 0;
    }
    for (size_t p = 0; p < parts.size(); ++p) {
      const CatalogTensor& local = parts[p].tensors[parts[p].Find(first.name)];
      bool compatible = local.dtype == first.dtype && local.shape.size() == first.shape.size();
      for (size_t d = 0; compatible && d < first.shape.size(); ++d) {
        if (static_cast<int>(d) != dim && local.shape[d] != first.shape[d]) compatible = false;
      }
      if (!compatible) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", first.name, "\": ", part_name(p), " has ", DTypeName(local.dtype), " ",
            ShapeToString(local.shape), " but part 0 has ", DTypeName(first.dtype), " ",
            ShapeToString(first.shape),
            rule->replicate ? " (replicated tensors must agree)"
                            : absl::StrCat(" (only dimension ", dim, " may differ)")));
      }
      // A part's own copies of its pieces (Megatron's expert-parallel ranks) stay replicas of
      // the merged tensor, at the box the merged pieces give them, for `verify` to compare. A
      // replicated tensor is read from part 0; the other parts' copies are its replicas too.
      if (rule->replicate) {
        for (SourcePiece piece : local.pieces) {
          piece.file += file_base[p];
          (p == 0 ? global.pieces : global.replicas).push_back(std::move(piece));
        }
        for (SourcePiece replica : local.replicas) {
          replica.file += file_base[p];
          global.replicas.push_back(std::move(replica));
        }
        continue;
      }
      if (rule->fused > 1) {
        // Every part holds K blocks of `rows`; block j of part p goes to rows
        // [j * parts * rows + p * rows, ...) of the global tensor.
        if (local.shape[dim] % rule->fused != 0 || local.shape[dim] != first.shape[dim]) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor \"", first.name, "\": ", part_name(p), " has ", local.shape[dim],
                           " rows along dimension ", dim, "; fused parts need equal multiples of ",
                           rule->fused));
        }
        const int64_t rows = local.shape[dim] / rule->fused;
        const int64_t global_block = rows * static_cast<int64_t>(parts.size());
        for (auto [from, to] : {std::pair(&local.pieces, &global.pieces),
                                std::pair(&local.replicas, &global.replicas)}) {
          for (SourcePiece piece : *from) {
            piece.file += file_base[p];
            ForEachBlock(piece, dim, rows, local.dtype, [&](int64_t j, SourcePiece sub) {
              sub.box.origin[dim] += j * global_block + static_cast<int64_t>(p) * rows - j * rows;
              to->push_back(std::move(sub));
            });
          }
        }
        global.shape[dim] += local.shape[dim];
        continue;
      }
      const int64_t shift = global.shape[dim];
      for (auto [from, to] : {std::pair(&local.pieces, &global.pieces),
                              std::pair(&local.replicas, &global.replicas)}) {
        for (SourcePiece piece : *from) {
          piece.file += file_base[p];
          piece.box.origin[dim] += shift;
          to->push_back(std::move(piece));
        }
      }
      global.shape[dim] += local.shape[dim];
    }
    merged.tensors.push_back(std::move(global));
  }
  merged.Reindex();
  return merged;
}

}  // namespace reshard
