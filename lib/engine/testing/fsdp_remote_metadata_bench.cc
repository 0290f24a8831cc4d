// Measures LoadInput (detection and the metadata read) of a verl, FSDP1 or OLMo-sharded save
// with many ranks on an in-memory store whose every range read waits a round trip, and prints
// the time, the store's requests and the most reads in flight at once:
//
//   fsdp_remote_metadata_bench [--layout verl|fsdp1|olmo-sharded] [--ranks 512] [--delay_ms 10]

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/fsdp/fsdp1_fixture.h"
#include "lib/formats/fsdp/olmo_sharded_fixture.h"
#include "lib/formats/fsdp/verl_fixture.h"

int main(int argc, char** argv) {
  std::string layout = "verl";
  int ranks = 512, delay_ms = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--layout") {
      layout = argv[i + 1];
    } else if (flag == "--ranks") {
      ranks = std::atoi(argv[i + 1]);
    } else if (flag == "--delay_ms") {
      delay_ms = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  std::map<std::string, std::string> files;
  if (layout == "verl") {
    files = reshard::VerlSaveFiles(ranks);
  } else if (layout == "fsdp1") {
    files = reshard::Fsdp1SaveFiles(ranks);
  } else if (layout == "olmo-sharded") {
    files = reshard::OlmoShardedSaveFiles(ranks);
  } else {
    std::fprintf(stderr, "unknown layout %s (verl, fsdp1, olmo-sharded)\n", layout.c_str());
    return 2;
  }
  const reshard::MetadataLoad load = reshard::UploadAndMeasure(
      "mem://bench/save", files, absl::Milliseconds(delay_ms),
      absl::StrCat(layout, ", ", ranks, " ranks, ", delay_ms, " ms per read"));
  if (!load.loaded.ok()) {
    std::fprintf(stderr, "%s\n", load.loaded.status().ToString().c_str());
    return 1;
  }
  return 0;
}
