// OLMo safetensors files for tests (the fixture of the "olmo-safetensors" input format).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_OLMO_OLMO_FIXTURE_H_
#define RESHARD_LIB_FORMATS_OLMO_OLMO_FIXTURE_H_

#include <string>
#include <vector>

#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/formats/olmo/olmo_keys.h"

namespace reshard {

// One entry of an OLMo file: a tensor, or (key.value_is_pickled) a pickle as U8 [size].
struct OlmoFixtureEntry {
  OlmoKey key;
  DType dtype = DType::kU8;
  Shape shape;
  std::string bytes;
};

// The entry for a pickled value.
OlmoFixtureEntry OlmoPickledEntry(std::vector<StructureNode> keys, std::string pickle);

// A safetensors file of `entries`, in the order given, names encoded with EncodeOlmoKey.
std::string OlmoSafetensorsFileOf(const std::vector<OlmoFixtureEntry>& entries);

// The fixture's file: ThreeFixtureTensors under ("model", "embed.weight"),
// ("model", "ln.weight") and ("optim", "state", 0, "step"), and the pickled
// ("optim", "param_groups") = [{"lr": 0.001, "params": [0]}].
std::vector<OlmoFixtureEntry> OlmoFixtureEntries();

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_OLMO_OLMO_FIXTURE_H_
