// The files of a verl FSDP save for tests of saves with many ranks; the fixture of the "verl-fsdp"
// input format is verl_fixture.cc (see lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_FSDP_VERL_FIXTURE_H_
#define RESHARD_LIB_FORMATS_FSDP_VERL_FIXTURE_H_

#include <map>
#include <string>

namespace reshard {

// The files of a verl save of `world` ranks, by name in the save folder
// (model_world_size_{world}_rank_{r}.pt): one DTensor "w" f32 [world, 8], Shard(0), holding
// FixtureF32Bytes(8 * world, 0), row r in rank r's file.
std::map<std::string, std::string> VerlSaveFiles(int world);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_VERL_FIXTURE_H_
