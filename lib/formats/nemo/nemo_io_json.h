// NeMo 2's context/io.json: the model config a `nemo.lightning` checkpoint records, read from
// fiddle's JSON serialization when context/model.yaml gives none.
//
// NeMo 2 (`nemo/lightning/io/mixin.py`, IOMixin.io_dump) writes the checkpoint's TrainerContext
// as `serialization.dump_json(io)` (fiddle, `fiddle/_src/experimental/serialization.py`):
//
//   {"root": {"type": "ref", "key": "trainer_context_1"},
//    "objects": {
//      "trainer_context_1": {"type": {"type": "pyref", "module": "fiddle._src.config",
//                                     "name": "Config"},
//                            "items": [["Attr(name='model')", {"type": "ref", "key": ...}], ...],
//                            "metadata": {"type": "ref", "key": "buildable_traverser_metadata_1"},
//                            "paths": ["<root>"]},
//      "buildable_traverser_metadata_1": {"type": <pyref BuildableTraverserMetadata>,
//                            "items": [["Attr(name='fn_or_cls')", <pyref of the callable>],
//                                      ["Attr(name='argument_names')", {"type": "ref", ...}],
//                                      ...], ...},
//      "tuple_1": {"type": <pyref builtins.tuple>, "items": [["Index(index=0)", "model"], ...]},
//      ...},
//    "refcounts": {...}, "version": "0.0.1"}
//
// A fdl.Config is an object whose items are its arguments' values in the order of its metadata's
// `argument_names`; a value is a JSON primitive, a leaf {"type": "leaf", "value": v}, a pyref
// {"type": "pyref", "module", "name"} (a function or class), a reference {"type": "ref", "key"}
// to an entry of "objects", or an inline object of the same shape. The model's config is the
// TrainerContext's `model` argument's `config` argument (GPTModel(config=LlamaConfig(...)): a
// dataclass NeMo turns into a fdl.Config holding every init field).

#ifndef RESHARD_LIB_FORMATS_NEMO_NEMO_IO_JSON_H_
#define RESHARD_LIB_FORMATS_NEMO_NEMO_IO_JSON_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/nemo/yaml_subset.h"

namespace reshard {

// io.json is read whole up to this size (real ones are tens to hundreds of KiB).
inline constexpr uint64_t kMaxNemoIoJsonBytes = 8 << 20;
// Arrays and objects nest at most this deep (a TrainerContext's own nesting is under 20).
inline constexpr int kMaxNemoIoJsonDepth = 64;

// The model config io.json `text` records, as the mapping context/model.yaml's `config` holds:
// `_target_` the config class ("nemo.collections.llm.gpt.model.llama.Llama3Config8B"), each
// argument a scalar (integers, floats, booleans and strings with their JSON text; JSON null a
// null node) or, for a function or class (activation_func), a mapping {_target_: module.name};
// other values (nested configs, tuples, dicts) are left out. nullopt when the TrainerContext has
// no `model` with a `config` that is a fdl.Config (a model io.json does not describe). `path`
// names the file in errors, which say the JSON path of what is wrong: DataLoss for text that is
// not JSON (with the byte offset), a layout that is not fiddle's (no root or objects, a
// reference to no object, a Config whose items and argument names disagree, a leaf without a
// value); ResourceExhausted past kMaxNemoIoJsonBytes or kMaxNemoIoJsonDepth.
absl::StatusOr<std::optional<YamlNode>> NemoIoJsonModelConfig(absl::string_view text,
                                                              absl::string_view path);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_NEMO_IO_JSON_H_
