// safetensors files for tests, and the fixture of the "safetensors" input format
// (safetensors_fixture.cc, see lib/formats/format_fixture.h).
//
// testonly: failures are reported through GoogleTest.

#ifndef RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FIXTURE_H_
#define RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FIXTURE_H_

#include <string>
#include <vector>

#include "lib/formats/format_fixture.h"

namespace reshard {

// A safetensors file holding `tensors` in the given order (the output writer's header encoder,
// no metadata); empty, with a test failure, when the header cannot be encoded.
std::string SafetensorsFileOf(const std::vector<FixtureTensor>& tensors);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FIXTURE_H_
