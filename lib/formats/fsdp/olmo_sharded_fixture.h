// The files of an OLMo LocalShardedCheckpointer save for tests of saves with many ranks; the fixture of the "olmo-sharded"
// input format is olmo_sharded_fixture.cc (see lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FIXTURE_H_
#define RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FIXTURE_H_

#include <map>
#include <string>

namespace reshard {

// The files of an OLMo LocalShardedCheckpointer save of `world` ranks, by path relative
// to the save folder (metadata.yaml and model/rank{r}.pt): one flat parameter "w" f32
// [world, 8] holding FixtureF32Bytes(8 * world, 0), row r (elements [8r, 8r + 8)) in rank r's
// file.
std::map<std::string, std::string> OlmoShardedSaveFiles(int world);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FIXTURE_H_
