// Turns a value tree of the safe pickle reader (pickle.h) into a StructureNode, faithfully, so
// that readers of training checkpoints (DeepSpeed, Megatron) can carry their non-tensor Python
// values (Megatron's `args` Namespace, loss scalers, Adam's `betas`, torch.Size, enums) to a
// writer that reproduces them (torch_output.h) and torch.load makes equal objects again.
//
// Nothing is dropped or merged: dicts keep their order and OrderedDict-ness (and a BUILD state,
// such as a state dict's `_metadata`), tuples stay tuples, globals stay globals (torch.float16),
// objects keep their callable, arguments, way of construction (REDUCE or NEWOBJ), items,
// entries and state. The reader's built-in values convert back to what pickle spells them as:
// a set becomes the object builtins.set([items]) (a frozenset too: the reader does not tell
// them apart), a bytearray becomes bytes.
//
// Tensors are the caller's: their data lives outside the pickle (persistent storage ids), so a
// tensor, or anything holding a persistent id, is an error unless the `replace` callback turns
// it into a node first (a kTensor leaf naming a Catalog tensor, or None to drop it).

#ifndef RESHARD_LIB_FORMATS_TORCH_PICKLE_STRUCTURE_H_
#define RESHARD_LIB_FORMATS_TORCH_PICKLE_STRUCTURE_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {

struct PickleStructureOptions {
  // Called on every value before it is converted, with its dotted path ("" for the root; dict
  // entries and an object's dict state by key, list and tuple items by index, an object's
  // arguments as "__args__.<i>", another state as "__state__"). A node it returns stands for
  // the value (and nothing below it is visited); nullopt converts the value as usual; an error
  // stops the conversion, prefixed with the path. Dict keys are not offered (their path is
  // their value's); an object's dict state is offered under the object's own path. May be
  // empty.
  std::function<absl::StatusOr<std::optional<StructureNode>>(const PickleValue* value,
                                                             absl::string_view path)>
      replace;
  // Deepest nesting converted (the root is level 0); StructureFromJson reads 64 levels.
  int max_depth = 64;
  // Most nodes made in all. A value the pickle's memo shares is converted once per reference,
  // so this bounds what a small pickle of shared containers could blow up into.
  uint64_t max_nodes = 1 << 24;
};

// The StructureNode of `value` and everything below it. InvalidArgument naming the path
// ("args.foo: ...") for values nested or shared beyond the options' limits; Unimplemented for a
// tensor or persistent id that `replace` did not replace.
absl::StatusOr<StructureNode> PickleToStructure(const PickleValue* value,
                                                const PickleStructureOptions& options = {});

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_PICKLE_STRUCTURE_H_
