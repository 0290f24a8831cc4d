// The one binding of a ConversionSpec to its outside forms: reshardctl's flags
// (ConversionFlags), the reshard.v1 JobSpec (bound by field name in
// proto/reshard/v1/job_spec_codec.h, so that lib/ stays free of gRPC) and the JSON the engine
// records: the whole request (ConversionRequestJson: a partitioned conversion's split record,
// the s3:// plan id) and the manifest's "request" (SpecToManifestRequest).
//
// Every member of ConversionSpec is one row of SpecFields(): its flag, JobSpec field and JSON
// key, how it is checked, and what zero means. The CLI, the daemon and the Python client reach
// the engine through these rows only, so they cannot disagree about a field; adding a member to
// ConversionSpec without a row fails to compile (spec_codec.cc), and a JobSpec field without a
// row fails job_spec_codec_test.
//
// Normalisation (NormalizeSpec) happens here once for every route: local paths become absolute
// and normal, a rules file or preset becomes inline rules JSON, and zero-valued settings become
// their defaults.

#ifndef RESHARD_LIB_ENGINE_SPEC_CODEC_H_
#define RESHARD_LIB_ENGINE_SPEC_CODEC_H_

#include <cstdint>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/core/status.h"  // IsUsageError
#include "lib/engine/conversion.h"
#include "nlohmann/json.hpp"

namespace reshard {

// Partition rules travel inline; this bounds them (a rules file, JobSpec.rules_json).
inline constexpr size_t kMaxRulesJsonBytes = 1 << 20;

// reshardctl's conversion options as typed on the command line (sizes, dtype and I/O mode as
// text), bound to the rows of SpecFields() by their flag_value. ParseConversionFlags turns them
// into a ConversionSpec.
struct ConversionFlags {
  std::string input;
  std::string output;
  std::string dtype = "keep";
  std::string max_shard_size = "5GB";
  int parts = 0;
  int pipeline_parts = 0;      // reshard --format megatron: pipeline stages
  int expert_parts = 0;        // reshard --format megatron: expert-parallel ranks
  bool update_latest = false;  // also write the format's tracker file beside OUT
  bool no_extra_files = false;  // leave out a Hugging Face input's config, tokenizer, README
  std::string tokenizer;        // --tokenizer DIR: carry the tokenizer files of DIR
  std::string rules;           // a rules JSON file or a preset name
  int threads = 2;
  std::string window_size = "32MiB";
  bool duplicate_tied = false;
  bool no_crc_check = false;                  // skip the torch.save CRC-32 check of the data read
  std::string io = "auto";                    // auto | direct | buffered (lib/io/io_mode.h)
  std::string output_format = "safetensors";  // one of OutputFormatIds()
  // Training checkpoints: DeepSpeed tag to read, and whether to read Adam moments too.
  std::string tag;
  bool include_optimizer = false;
  // --format hf: --family, --config FILE, --vocab-size.
  std::string hf_family;
  std::string hf_config_file;
  int hf_vocab_size = 0;
  // consolidate/reshard: `--partition I/K | auto | auto/K` (lib/engine/partition_spec.h);
  // empty: not partitioned. plan: `--partitions K` shows each partition's files.
  std::string partition;
  int partitions = 0;
  // consolidate/reshard: replace a non-empty output folder or s3:// prefix (`--overwrite`).
  bool overwrite = false;
};

// A typed member of ConversionSpec (captureless lambdas convert to these).
template <typename T>
using SpecMember = T& (*)(ConversionSpec&);
using SpecAccess =
    std::variant<SpecMember<ConversionSpec::Kind>, SpecMember<std::string>,
                 SpecMember<DTypePolicy>, SpecMember<uint64_t>, SpecMember<int>,
                 SpecMember<bool>, SpecMember<IoMode>>;

// The value `member` designates in a read-only spec (the accessors take a mutable one).
template <typename T>
const T& ReadSpecMember(const ConversionSpec& spec, SpecMember<T> member) {
  return member(const_cast<ConversionSpec&>(spec));
}

// Lambdas overloaded by type, for std::visit over SpecAccess.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// The member of ConversionFlags a field is typed into on the command line.
using FlagAccess = std::variant<std::monostate, std::string ConversionFlags::*,
                                int ConversionFlags::*, bool ConversionFlags::*>;

// How messages name fields: by reshardctl flag, or by JobSpec field ("spec.parts").
enum class SpecNaming { kFlags, kProto };

struct SpecField {
  absl::string_view name;   // the member of ConversionSpec ("tag" for read.tag)
  absl::string_view flag;   // reshardctl's option ("--dtype"); "" when it has none
  absl::string_view help;   // reshardctl's help text of `flag`
  absl::string_view proto;  // the reshard.v1 JobSpec field; "" when the daemon takes none
  // The key in ConversionRequestJson, "" for settings that change no output byte (threads,
  // window, I/O mode, CRC check, partition) and so are not part of the request's identity.
  absl::string_view json;
  SpecAccess access;
  FlagAccess flag_value;  // where reshardctl keeps the flag's text; monostate: set otherwise
  // A byte count: its flag takes "5GB", "32MiB", ...
  bool byte_size = false;
  // Zero (or empty) from a JobSpec or a flag means ConversionSpec's default.
  bool zero_is_default = false;
  // OK, or InvalidArgument naming the field as `naming` says. Null: any value is valid.
  absl::Status (*check)(const ConversionSpec& spec, const SpecField& field,
                        SpecNaming naming) = nullptr;
  // Whether the field belongs to the manifest's "request" (what the output is, written with it
  // and matched on a rerun) for `spec`, under its JSON key. Null: never.
  bool (*in_manifest)(const ConversionSpec& spec) = nullptr;
};

// Every field of ConversionSpec, in the order of ConversionRequestJson's keys.
absl::Span<const SpecField> SpecFields();

// The row named `name`; dies on an unknown name (a programming error).
const SpecField& SpecFieldNamed(absl::string_view name);

// `field` as messages name it: "--max-shard-size" or "spec.max_shard_size".
std::string SpecFieldLabel(const SpecField& field, SpecNaming naming);

// The value of `field` in `spec` as text ("consolidate", "bf16", "5000000000", "true"), for
// messages and comparisons.
std::string SpecFieldText(const ConversionSpec& spec, const SpecField& field);

// The spec of reshardctl's `consolidate` (reshard == false) or `reshard` with `flags`, not yet
// normalised. InvalidArgument for a value no option takes (a usage error).
absl::StatusOr<ConversionSpec> ParseConversionFlags(const ConversionFlags& flags, bool reshard);

// Local paths absolute and lexically normal without a trailing '/' (URLs such as s3://... as
// given), rules from `rules_file` (a file, at most kMaxRulesJsonBytes, or a preset name) inline
// in `rules_json` and checked, `rules_file` then empty; zero-valued settings their defaults.
// Idempotent.
absl::StatusOr<ConversionSpec> NormalizeSpec(ConversionSpec spec);

// Every row's check: InvalidArgument naming the first field that is out of range, or given to
// a job that does not read it (IsUsageError): --family and --config are read by --format hf
// and by megatron and megatron-torch-dist outputs of a Hugging Face input, --vocab-size by
// --format hf only.
absl::Status ValidateSpec(const ConversionSpec& spec, SpecNaming naming);

// What ValidateSpec cannot know before the input is read: InvalidArgument (IsUsageError)
// naming --family or --config when `spec` gives one for an output other than hf whose input
// (read as `input_format`) was not imported as a Hugging Face model (`hf_model_imported`:
// OutputFormat::PresentInput presented it), which would ignore it. Checked by PlanConversion.
absl::Status CheckHfImportFlags(const ConversionSpec& spec, bool hf_model_imported,
                                absl::string_view input_format, SpecNaming naming);

// reshardctl's help text of `field`: its row's help, with the lists it names taken from the
// registries ("{output_formats}": OutputFormatIds(), "{hf_families}": HfFamilies()).
std::string SpecFieldHelp(const SpecField& field);

// The request as every run of it must see it (see ConversionRequestJson).
absl::StatusOr<nlohmann::ordered_json> SpecToRequestJson(const ConversionSpec& spec);

// The manifest's "request": the fields whose in_manifest says so, as given.
nlohmann::ordered_json SpecToManifestRequest(const ConversionSpec& spec);

// The inverse of SpecToRequestJson for a record read back from a shared folder: DataLoss
// naming `where` and the key for a missing or mistyped key.
absl::StatusOr<ConversionSpec> SpecFromRequestJson(const nlohmann::ordered_json& request,
                                                   absl::string_view where);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_SPEC_CODEC_H_
