// OLMo's safetensors key mapping (olmo/safetensors_util.py): a nested state dict is flattened
// into safetensors entries whose names encode where each value sits and whether it is a
// pickled non-tensor value:
//
//   STKey(keys, value_is_pickled)
//   encode_key(k) = base64.urlsafe_b64encode(pickle.dumps((k.keys, k.value_is_pickled)))
//
// `keys` is the tuple of dict keys from the root to the value (str, or int for an optimizer's
// parameter ids); `value_is_pickled` says the entry is not a tensor but `pickle.dumps(value)`
// stored as a 1-d uint8 tensor. Every other value is a tensor under its key path. With
// Python's default pickle protocol (4) every encoded key starts with "gASV".
//
// Decoding runs the safe pickle reader (lib/formats/torch/pickle.h): nothing is executed, and a
// key that is not the base64 of a pickled ((str | int, ...), bool) is an error naming it.
// Encoding writes the bytes CPython's pickle.dumps writes for such a tuple (protocol 4, one
// frame, every str and tuple memoized), so keys match OLMo's own byte for byte.

#ifndef RESHARD_LIB_FORMATS_OLMO_OLMO_KEYS_H_
#define RESHARD_LIB_FORMATS_OLMO_OLMO_KEYS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"

namespace reshard {

// One decoded key: the key path (kString and kInt nodes) and whether the value is pickled.
struct OlmoKey {
  std::vector<StructureNode> keys;
  bool value_is_pickled = false;
};

// Encodes `key` as OLMo's encode_key does. InvalidArgument for an empty key path or a key part
// that is neither a str nor an int.
absl::StatusOr<std::string> EncodeOlmoKey(const OlmoKey& key);

// Decodes a safetensors entry name written by OLMo's encode_key. DataLoss saying what is wrong
// (not url-safe base64, not a pickle, not a ((keys...), bool) tuple, a key part that is neither
// str nor int); the caller adds the file and the name.
absl::StatusOr<OlmoKey> DecodeOlmoKey(absl::string_view encoded);

// Cheap check for format probes: `name` is url-safe base64 (padded) of bytes that start as a
// pickle of protocol 2 or later does (0x80, then the protocol).
bool LooksLikeOlmoKey(absl::string_view name);

// The key path as a dotted name, as the torch reader names nested tensors: str keys as they
// are, int keys in decimal ("optim.state.0.exp_avg").
std::string OlmoDottedName(const OlmoKey& key);

// The key path as Python would print the tuple, for messages: ('optim', 'state', 0).
std::string OlmoKeyTuple(const OlmoKey& key);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_OLMO_OLMO_KEYS_H_
