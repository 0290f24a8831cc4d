// The files of a ColossalAI distributed checkpoint for tests of saves with many ranks; the
// fixture of the "colossalai-dist" input format is colossalai_fixture.cc (see
// lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FIXTURE_H_
#define RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FIXTURE_H_

#include <map>
#include <string>

namespace reshard {

// The files of a ColossalAI distributed checkpoint of `world` tensor-parallel ranks, by name in
// the save folder: pytorch_model-meta-dist-{r:05}.index.json and
// pytorch_model-dist-{r:05}.safetensors per rank, one tensor "w" f32 [world, 8] holding
// FixtureF32Bytes(8 * world, 0), row r in rank r's weight file.
std::map<std::string, std::string> ColossalSaveFiles(int world);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FIXTURE_H_
