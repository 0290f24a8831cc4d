// The files of an FSDP1 sharded state dict save for tests of saves with many ranks; the fixture of the "fsdp1-sharded"
// input format is fsdp1_fixture.cc (see lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_FSDP_FSDP1_FIXTURE_H_
#define RESHARD_LIB_FORMATS_FSDP_FSDP1_FIXTURE_H_

#include <map>
#include <string>

namespace reshard {

// The files of an FSDP1 SHARDED_STATE_DICT save of `world` ranks, by name in the save
// folder (model_rank{r}.pt): one ShardedTensor "w" f32 [world, 8] chunked by rows, holding
// FixtureF32Bytes(8 * world, 0), row r in rank r's file.
std::map<std::string, std::string> Fsdp1SaveFiles(int world);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_FSDP1_FIXTURE_H_
