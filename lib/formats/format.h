// Input and output formats, and the registry through which they plug into the engine.
//
// A format is one InputFormat (metadata only -> Catalog) and/or one OutputFormat (file names
// and framing). Each registers itself from its own .cc with a file-scope
// `InputFormatRegistration<T>` / `OutputFormatRegistration<T>` object; its Bazel target sets
// `alwayslink = True`, and `//lib/formats:all_formats` links every format. The planner and the
// executor never see a format.

#ifndef RESHARD_LIB_FORMATS_FORMAT_H_
#define RESHARD_LIB_FORMATS_FORMAT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/plan/layout.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

// Training state that is not the model's weights, as a training framework saved it: carried
// by output formats that write checkpoints to resume training from (DeepSpeed universal,
// Megatron), ignored by the others.
struct TrainingState {
  // Named non-tensor values, as saved: "megatron.args" (the argparse.Namespace),
  // "megatron.iteration", "deepspeed.optimizer_state" (the optimizer's state dict without its
  // partitioned tensors), ...; each reader documents the names it sets.
  std::map<std::string, StructureNode> values;
  // Tensors that are not weights (Adam's step counters: "deepspeed.step"). Their pieces index
  // `files`, not the Catalog's.
  std::vector<CatalogTensor> tensors;
  std::vector<SourceFile> files;
  // Input files an output copies byte for byte (DeepSpeed's model-states files), as paths.
  std::vector<std::string> verbatim_files;
  // Why the training state could not be read completely (a value reshard cannot carry). The
  // model itself was read; only output formats that need the training state fail with it.
  absl::Status problem;
  // Why the model's config ("megatron.args") could not be read from the file that records it
  // (a malformed NeMo 2 context/io.json). The weights were read; `--format hf`, which needs the
  // config, fails with it.
  absl::Status args_problem;

  // values[name], or null.
  const StructureNode* Value(absl::string_view name) const {
    auto it = values.find(std::string(name));
    return it == values.end() ? nullptr : &it->second;
  }
};

// A file of the model beside its weights that a reader found inside its input (a tokenizer member
// of a NeMo archive): bytes [offset, offset + size) of file `path`, carried into a Hugging Face
// output (`--format hf`) under `name`.
struct EmbeddedModelFile {
  std::string name;  // its name in the output: "tokenizer.model"
  std::string path;  // the file holding it (the archive), as the storage layer reads it
  uint64_t offset = 0;
  uint64_t size = 0;
  std::string member;  // its name in the archive, for messages: "<md5>_tokenizer.model"
};

// What an InputFormat found at a path.
struct InputModel {
  std::string format;  // the format's id
  // How the model is spread over files: "single-file", "sharded" (one model in several
  // files) or "model-parallel-parts". (Reported under the JSON key "layout" by inspect and the
  // manifest, for compatibility; "layout" in the code means the output's TargetLayout.)
  std::string arrangement;
  // One Catalog for a whole model; N for N model-parallel parts, in rank order.
  std::vector<Catalog> parts;
  std::vector<std::string> part_names;  // a file or folder name per part, for messages
  // What the reader identified, in a sentence for `inspect` and the manifest:
  // "DeepSpeed ZeRO-3, 4 data-parallel ranks, tag global_step10". Empty: nothing beyond
  // format and layout.
  std::string description;
  // Partition rules for merging or splitting the parts when the user gives none: the rule set
  // the training framework itself uses (Megatron's). Empty: the user must give rules.
  std::vector<PartitionRule> default_rules;
  // What a training run needs beside the weights to resume, for output formats that write
  // checkpoints to train from (see TrainingState). Empty for formats without it.
  TrainingState training_state;
  // The model's files inside the input (a NeMo archive's tokenizer members) or beside its
  // weights in the reader's own layout (a NeMo 2 folder's context/nemo_tokenizer/), which
  // `--format hf` carries (lib/formats/hf/model_files.h). Empty for most formats.
  std::vector<EmbeddedModelFile> model_files;
};

// Choices a user can make about what is read.
struct ReadOptions {
  // The checkpoint to read inside a training output folder with several (DeepSpeed's
  // `global_step1200`); empty: the one the folder's `latest` file names.
  std::string tag;
  // Also read the optimizer's Adam moments (exp_avg, exp_avg_sq) as tensors of their own,
  // "<param>.exp_avg" and "<param>.exp_avg_sq", where the format keeps them per parameter.
  bool include_optimizer = false;
};

class InputFormat {
 public:
  virtual ~InputFormat() = default;
  virtual absl::string_view id() const = 0;
  // Cheap check (names, magic bytes) whether `path` is in this format: false when it is not.
  // A path that cannot be looked at (permission denied, an I/O or store error) is an error
  // naming the path, never false: the user learns why, rather than that the checkpoint is in no
  // format. Called without any lock held, possibly from several threads at once.
  virtual absl::StatusOr<bool> Probe(const std::string& path) const = 0;
  // Formats that recognize a folder by a specific arrangement of files (a DeepSpeed or DCP
  // checkpoint, which also hold .pt files) are asked before generic ones (a folder of .pt
  // files): higher first. Every format gives its own, distinct priority, so that detection
  // does not depend on registration (static-initialization) order:
  //   nemo 50 (a NeMo 2 folder's weights/ is a torch_dist folder), megatron-torch-dist 45
  //   (a Megatron-Core torch_dist folder holds DCP files and sits where Megatron-LM's
  //   iterations do), megatron 40, colossalai-dist 35, torch-dcp 30,
  //   deepspeed-universal 25, deepspeed-zero 20, verl-fsdp 17 (.pt files named by world size
  //   and rank), olmo-sharded 16 (model/rank{N}.pt), olmo-safetensors 15 (a safetensors file
  //   recognized by its entry names), fsdp1-sharded 14 (<prefix>rank{N}.pt holding
  //   ShardedTensors), safetensors 10, torch 0.
  virtual int probe_priority() const = 0;
  // Reads metadata and builds the Catalog(s). Errors name the file and what is wrong.
  virtual absl::StatusOr<InputModel> Read(const std::string& path,
                                          const ReadOptions& options) const = 0;
};

// What a user can say about a Hugging Face model that the checkpoint may not record: when writing
// one (`--format hf`), and when importing one into Megatron (family and config only).
struct HfExportOptions {
  // The model family (lib/formats/hf/hf_family.h): "llama", "mistral", ...; empty or "auto":
  // decided from the checkpoint's args and tensor names.
  std::string family;
  // A JSON object whose keys override or complete the config.json made from the args; when
  // importing, the config.json read in place of the input folder's.
  std::string config_file;
  // The true vocabulary (the tokenizer's size): padded rows past it are dropped. 0: from
  // --config or the args.
  int vocab_size = 0;
};

// What an OutputFormat that arranges its own files is given (see OutputFormat::Arrange).
struct ArrangeRequest {
  const InputModel& model;
  // The tensors the plan reads: the whole model, or its fused-block view for a split.
  const Catalog& catalog;
  bool consolidate = true;  // else reshard into `parts`
  int parts = 0;
  int pipeline_parts = 0;  // reshard: pipeline stages asked for (0: the format's default)
  int expert_parts = 0;    // reshard: expert-parallel ranks asked for (0: the format's default)
  DTypePolicy dtype = DTypePolicy::kKeep;
  // The output folder's name (its last path component), for trackers that name it.
  std::string output_name;
  // Consolidate: the largest output file (the engine layout's rule), for formats that shard
  // their own tensors.
  uint64_t max_shard_size = 5'000'000'000ull;
  HfExportOptions hf;
  // The files the conversion carries beside the weights (lib/formats/hf/model_files.h), as
  // (name in the output, path read): `--format hf` reads its tokenizer's special token ids.
  std::vector<std::pair<std::string, std::string>> model_files;
  // The carried files that are members of an archive (a `.nemo`'s tokenizer), as byte ranges
  // of it; read likewise.
  std::vector<EmbeddedModelFile> archive_model_files;
};

// An OutputFormat's own arrangement of the output.
struct ArrangedOutput {
  TargetLayout layout;
  // Tensors the layout's files read beyond the Catalog's: OutputTensor::source
  // `catalog.tensors.size() + i` is extra_tensors[i], whose pieces index `extra_files`.
  std::vector<CatalogTensor> extra_tensors;
  std::vector<SourceFile> extra_files;
  // Small files written into the output folder's parent after publishing, (name, contents):
  // trackers that name the output (DeepSpeed's `latest_universal`).
  std::vector<std::pair<std::string, std::string>> beside_output;
};

// Adds to `arranged` a copy of the input file `path`, byte for byte, as the output file
// `output_name`: a verbatim file whose one tensor is the file's bytes (kU8). The file is opened
// under the thread's path confinement; errors name it.
absl::Status AddVerbatimCopy(const std::string& path, const std::string& output_name,
                             const Catalog& catalog, ArrangedOutput& arranged);
// As AddVerbatimCopy, of bytes [offset, offset + size) of input file `path` (a member of an
// archive): DataLoss naming the file when it is shorter than offset + size.
absl::Status AddVerbatimRangeCopy(const std::string& path, uint64_t offset, uint64_t size,
                                  const std::string& output_name, const Catalog& catalog,
                                  ArrangedOutput& arranged);

class OutputFormat {
 public:
  virtual ~OutputFormat() = default;
  virtual absl::string_view id() const = 0;
  virtual OutputNaming naming() const = 0;
  // Formats that write checkpoints to resume training from need the optimizer's state; the
  // engine then reads it (ReadOptions::include_optimizer) whatever the request said.
  virtual bool needs_optimizer_state() const { return false; }
  // Formats whose files are not the engine's shards or parts (a DeepSpeed universal
  // checkpoint's three files per parameter, Megatron's TP x PP folders) rearrange the layout
  // the engine built (`engine_layout`: every tensor whole in one or more shards to
  // consolidate, one file per part to reshard). The default keeps it.
  virtual absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                                 const ArrangeRequest& request) const {
    ArrangedOutput arranged;
    arranged.layout = std::move(engine_layout);
    return arranged;
  }
  // Output formats that write the model under another framework's names may present the input
  // as that framework's model before the engine lays it out (megatron: a Hugging Face model as
  // the merged Megatron-LM model, lib/formats/hf/hf_import.h). `input` is the path the user
  // gave, `catalog` the merged model, `parts` and `pipeline_parts` the sizes asked for (1 to
  // consolidate), `hf` what the user said of a Hugging Face input (--family, --config). When it
  // returns true, `model` (its training_state and default_rules, which replace any --rules) and
  // `catalog` are what the layout and Arrange see. The default: false.
  virtual absl::StatusOr<bool> PresentInput(const std::string& input, int parts,
                                            int pipeline_parts, const HfExportOptions& hf,
                                            InputModel& model, Catalog& catalog) const {
    return false;
  }
  // Lays out one output file: the bytes the format owns and where each tensor's data goes.
  virtual absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const = 0;
  // Files written after the data files, such as a sharded model's index: (name, contents).
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const = 0;
};

void RegisterInputFormat(std::unique_ptr<InputFormat> format);
void RegisterOutputFormat(std::unique_ptr<OutputFormat> format);

// The input format of highest probe_priority whose Probe accepts `path` (local or remote
// alike); InvalidArgument listing the known formats otherwise, NotFound when the path does not
// exist. The first error a Probe returns is returned as it is (a file that cannot be read is
// not "in no format"). The probes run without the registry's lock: they do I/O, which can take
// as long as a remote store takes to answer.
absl::StatusOr<const InputFormat*> DetectInputFormat(const std::string& path);

// The output format with id `id`; InvalidArgument listing the known ones otherwise.
absl::StatusOr<const OutputFormat*> FindOutputFormat(absl::string_view id);

// The ids of the registered formats, in registration order.
std::vector<std::string> InputFormatIds();
std::vector<std::string> OutputFormatIds();

// A description of `model` from its layout and number of parts or files, for formats that set
// none and for formats describing themselves: "safetensors, one model in 3 shards",
// "torch.save, 2 metaseq model-parallel parts (...)". `format_name` is how the format is called
// (model.format when empty); `parts_origin` names who wrote model-parallel parts ("metaseq"),
// empty when unknown.
std::string DescribeInputModel(const InputModel& model, absl::string_view format_name = {},
                               absl::string_view parts_origin = {});

template <typename T>
struct InputFormatRegistration {
  InputFormatRegistration() { RegisterInputFormat(std::make_unique<T>()); }
};

template <typename T>
struct OutputFormatRegistration {
  OutputFormatRegistration() { RegisterOutputFormat(std::make_unique<T>()); }
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FORMAT_H_
