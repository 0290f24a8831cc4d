#include "lib/formats/deepspeed/universal_output.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/deepspeed/universal_patterns.h"
#include "lib/formats/torch/torch_output.h"
#include "lib/io/directory.h"

namespace reshard {
namespace {

using Node = StructureNode;

// The names of the tensors `node` holds, each once, in order.
void TensorNames(const Node& node, std::vector<std::string>& names) {
  if (node.kind == Node::Kind::kTensor) {
    if (std::find(names.begin(), names.end(), node.text) == names.end()) {
      names.push_back(node.text);
    }
    return;
  }
  for (const auto* children : {&node.keys, &node.values, &node.items, &node.args, &node.state}) {
    for (const Node& child : *children) TensorNames(child, names);
  }
}

// One torch.save file holding `structure`, with `tensors`.
OutputFileLayout TorchFile(std::string name, std::vector<OutputTensor> tensors, Node structure) {
  OutputFileLayout file;
  file.name = std::move(name);
  file.tensors = std::move(tensors);
  file.structure = std::make_shared<const Node>(std::move(structure));
  return file;
}

const TorchOutput& TorchWriter() {
  static const TorchOutput* writer = new TorchOutput;
  return *writer;
}

}  // namespace

OutputNaming UniversalOutput::naming() const {
  // The engine's consolidated layout is rearranged by Arrange; these names are never written.
  OutputNaming naming;
  naming.shard_file = [](int index, int) { return absl::StrCat("unused-", index); };
  naming.part_file = [](int rank, int) { return absl::StrCat("unused-part-", rank); };
  return naming;
}

absl::StatusOr<ArrangedOutput> UniversalOutput::Arrange(TargetLayout /*engine_layout*/,
                                                        const ArrangeRequest& request) const {
  if (!request.consolidate) {
    return absl::InvalidArgumentError(
        "a DeepSpeed universal checkpoint is written by `consolidate` (it holds every parameter "
        "whole, and DeepSpeed slices it for the new topology when it loads); use `reshardctl "
        "consolidate IN OUT --format deepspeed-universal`");
  }
  if (request.dtype != DTypePolicy::kKeep && request.dtype != DTypePolicy::kF32) {
    return absl::InvalidArgumentError(
        "a DeepSpeed universal checkpoint holds the float32 master weights and moments: --dtype "
        "must be keep or fp32");
  }
  const Catalog& catalog = request.catalog;
  const TrainingState& state = request.model.training_state;
  RETURN_IF_ERROR(state.problem, "reading the training state to carry over");
  if (state.verbatim_files.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the input (",
        request.model.description.empty() ? request.model.format : request.model.description,
        ") carries no DeepSpeed training state (model-states files, optimizer state): a "
        "universal checkpoint is made from a DeepSpeed ZeRO checkpoint with its optimizer files"));
  }
  ASSIGN_OR_RETURN(const UniversalPatterns patterns,
                   UniversalPatterns::FromInfo(state.Value("deepspeed.universal_checkpoint_info")));
  const Node* param_groups = state.Value("deepspeed.param_group");

  ArrangedOutput arranged;
  // The step of each flat group (step.pt), as extra source tensors, added once per group.
  std::optional<int> state_file_base;       // where state.files start in extra_files, once added
  std::map<std::string, int> state_source;  // training-state tensor name -> source index
  auto state_tensor = [&](const std::string& name) -> std::optional<int> {
    if (auto it = state_source.find(name); it != state_source.end()) return it->second;
    for (const CatalogTensor& tensor : state.tensors) {
      if (tensor.name != name) continue;
      if (!state_file_base.has_value()) {
        state_file_base = static_cast<int>(arranged.extra_files.size());
        for (const SourceFile& file : state.files) arranged.extra_files.push_back(file);
      }
      const int file_base = *state_file_base;
      CatalogTensor copy = tensor;
      for (SourcePiece& piece : copy.pieces) piece.file += file_base;
      const int source = static_cast<int>(catalog.tensors.size() + arranged.extra_tensors.size());
      arranged.extra_tensors.push_back(std::move(copy));
      state_source[name] = source;
      return source;
    }
    return std::nullopt;
  };
  // A training-state tensor as an OutputTensor of its own name.
  auto state_output = [&](const std::string& name) -> std::optional<OutputTensor> {
    std::optional<int> source = state_tensor(name);
    if (!source.has_value()) return std::nullopt;
    const CatalogTensor& data = arranged.extra_tensors[*source - catalog.tensors.size()];
    OutputTensor out;
    out.name = name;
    out.source = *source;
    out.region = Box::Full(data.shape);
    out.dtype = data.dtype;
    return out;
  };
  // DeepSpeed's ZeRO-3 loader (stage3.py, load_hp_checkpoint_state) reads each state file as
  // one tensor and flattens it, as ds_to_universal's ZeRO-3 path writes it; ZeRO-1/2's
  // (universal_checkpoint.py) reads the dict with the merge keys.
  const Node* zero_stage = state.Value("deepspeed.zero_stage");
  const bool bare_flat =
      zero_stage != nullptr && zero_stage->kind == Node::Kind::kInt && zero_stage->integer == 3;

  int params = 0;
  for (size_t t = 0; t < catalog.tensors.size(); ++t) {
    const CatalogTensor& tensor = catalog.tensors[t];
    const int exp_avg = catalog.Find(absl::StrCat(tensor.name, ".exp_avg"));
    const int exp_avg_sq = catalog.Find(absl::StrCat(tensor.name, ".exp_avg_sq"));
    if (exp_avg < 0 || exp_avg_sq < 0) continue;
    ++params;
    if (!CheckPlainName(tensor.name).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", tensor.name,
                       "\" cannot name a folder of zero/ (it must be a plain "
                       "file name)"));
    }
    // The keys ds_to_universal saves with each state, from how it merged the TP slices (the
    // readers merged them the same way, from the same patterns).
    const UcpParamRule rule = patterns.Classify(tensor.name);
    if (rule.merge == UcpMerge::kSubParams &&
        patterns.SubParamShape(tensor.name)->shape != tensor.shape) {
      // DeepSpeed views the tensor as that shape to slice it.
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", tensor.name, "\" is ", ShapeToString(tensor.shape),
                       " but universal_checkpoint_info.parameter_with_sub_params gives it shape ",
                       ShapeToString(patterns.SubParamShape(tensor.name)->shape)));
    }
    Box region = Box::Full(tensor.shape);
    const bool vocab = rule.vocab;
    if (vocab && patterns.original_vocab_size().has_value() && !region.extent.empty() &&
        *patterns.original_vocab_size() < region.extent[0]) {
      region.extent[0] = *patterns.original_vocab_size();  // the TP padding rows go
    }
    const std::string folder = absl::StrCat("zero/", tensor.name, "/");
    for (const auto& [state_name, source] :
         {std::pair<const char*, int>{"fp32", static_cast<int>(t)},
          {"exp_avg", exp_avg},
          {"exp_avg_sq", exp_avg_sq}}) {
      const CatalogTensor& data = catalog.tensors[source];
      if (data.dtype != DType::kF32 || data.shape != tensor.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", data.name, "\" is ", DTypeName(data.dtype), " ",
                         ShapeToString(data.shape), "; a universal checkpoint needs float32 ",
                         ShapeToString(tensor.shape), " like \"", tensor.name, "\""));
      }
      OutputTensor out;
      out.name = data.name;
      out.source = source;
      out.region = region;
      out.dtype = DType::kF32;
      if (rule.merge == UcpMerge::kAverage) {
        // ds_to_universal: sum(slices) / len(slices) of the TP ranks' slices, which the reader
        // keeps as "deepspeed.tp_slice.<t>.<name>" (none with one TP rank: the slice is whole).
        for (int t = 0;; ++t) {
          std::optional<int> slice =
              state_tensor(absl::StrCat("deepspeed.tp_slice.", t, ".", data.name));
          if (!slice.has_value()) break;
          out.mean_of.push_back(*slice);
        }
        // One TP rank: still (0 + slice) / 1, which turns -0.0 into +0.0 as upstream does.
        if (out.mean_of.empty()) out.mean_of.push_back(source);
        out.source = out.mean_of.front();
      }
      if (bare_flat) {
        out.written_shape = {NumElementsUnchecked(region.extent)};
        arranged.layout.files.push_back(TorchFile(absl::StrCat(folder, state_name, ".pt"),
                                                  {std::move(out)}, Node::Tensor(data.name)));
        continue;
      }
      Node dict = Node::Dict();
      if (rule.merge == UcpMerge::kSubParams) {
        // The SubparamShape object instead of cat_dim: DeepSpeed slices each sub-param.
        dict.Add(Node::String("sub_param_shape"), patterns.SubParamShape(tensor.name)->saved);
      } else if (rule.merge != UcpMerge::kReplicated && rule.merge != UcpMerge::kAverage) {
        // (replicated and averaged params have no cat_dim)
        dict.Add(Node::String("cat_dim"), Node::Int(rule.merge == UcpMerge::kRowParallel ? 1 : 0));
      }
      if (rule.merge == UcpMerge::kTwoSubParams) {
        dict.Add(Node::String("param_n_sub_params"), Node::Int(2));
      }
      if (vocab) dict.Add(Node::String("vocab_tensor"), Node::Bool(true));
      dict.Add(Node::String("param"), Node::Tensor(data.name));
      arranged.layout.files.push_back(
          TorchFile(absl::StrCat(folder, state_name, ".pt"), {std::move(out)}, std::move(dict)));
    }
    const Node* group = FindKey(param_groups, tensor.name);
    if (group != nullptr && group->kind == Node::Kind::kInt) {
      const Node* step_value = state.Value(absl::StrCat("deepspeed.step.", group->integer));
      if (step_value != nullptr) {  // saved as a number, not a tensor
        arranged.layout.files.push_back(
            TorchFile(absl::StrCat(folder, "step.pt"), {}, *step_value));
      } else if (std::optional<OutputTensor> step =
                     state_output(absl::StrCat("deepspeed.step.", group->integer));
                 step.has_value()) {
        const std::string step_name = step->name;
        arranged.layout.files.push_back(TorchFile(absl::StrCat(folder, "step.pt"),
                                                  {*std::move(step)}, Node::Tensor(step_name)));
      }
    }
  }
  if (params == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the input (",
        request.model.description.empty() ? request.model.format : request.model.description,
        ") has no parameters with Adam moments (<param>.exp_avg, <param>.exp_avg_sq): a "
        "universal checkpoint is made from a DeepSpeed ZeRO checkpoint with its optimizer files"));
  }
  const Node* optimizer_state = state.Value("deepspeed.optimizer_state");
  if (optimizer_state != nullptr) {
    // Its tensors (ZeRO-3's per-sub-group steps) are training-state tensors.
    std::vector<std::string> names;
    TensorNames(*optimizer_state, names);
    std::vector<OutputTensor> tensors;
    for (const std::string& name : names) {
      std::optional<OutputTensor> tensor = state_output(name);
      if (!tensor.has_value()) {
        return absl::InternalError(absl::StrCat("the optimizer state names tensor \"", name,
                                                "\", which the reader did not give"));
      }
      tensors.push_back(*std::move(tensor));
    }
    arranged.layout.files.push_back(
        TorchFile("zero/optimizer_state.pt", std::move(tensors), *optimizer_state));
  }
  for (const std::string& path : state.verbatim_files) {
    RETURN_IF_ERROR(
        AddVerbatimCopy(path, std::filesystem::path(path).filename().string(), catalog, arranged));
  }
  arranged.beside_output.emplace_back("latest_universal", request.output_name);
  return arranged;
}

absl::StatusOr<FileFraming> UniversalOutput::Frame(const OutputFileLayout& file) const {
  return TorchWriter().Frame(file);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> UniversalOutput::CompanionFiles(
    const TargetLayout& /*layout*/) const {
  return std::vector<std::pair<std::string, std::string>>{};
}

namespace {
const OutputFormatRegistration<UniversalOutput> kRegistration;
}  // namespace

}  // namespace reshard
