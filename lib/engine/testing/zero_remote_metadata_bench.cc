// Measures LoadInput (detection and the metadata read) of a ZeRO save with many ranks on an
// in-memory store whose every range read waits a round trip, and prints the time, the store's
// requests and the most reads in flight at once:
//
//   zero_remote_metadata_bench [--ranks 512] [--stage 3] [--delay_ms 10] [--write DIR]
//
// With --write, the save's files are written under DIR instead (a local save to time).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/testing/test_files.h"

int main(int argc, char** argv) {
  int ranks = 512, stage = 3, delay_ms = 10;
  std::string write_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") {
      ranks = std::atoi(argv[i + 1]);
    } else if (flag == "--stage") {
      stage = std::atoi(argv[i + 1]);
    } else if (flag == "--delay_ms") {
      delay_ms = std::atoi(argv[i + 1]);
    } else if (flag == "--write") {
      write_dir = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const std::map<std::string, std::string> files = reshard::ZeroSaveFiles(stage, ranks);
  if (!write_dir.empty()) {
    for (const auto& [name, bytes] : files) {
      const std::string path = absl::StrCat(write_dir, "/", name);
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      reshard::WriteAll(path, bytes);
    }
    return 0;
  }
  const reshard::MetadataLoad load = reshard::UploadAndMeasure(
      "mem://bench/save", files, absl::Milliseconds(delay_ms),
      absl::StrCat("ZeRO-", stage, ", ", ranks, " ranks, ", delay_ms, " ms per read"));
  if (!load.loaded.ok()) {
    std::fprintf(stderr, "%s\n", load.loaded.status().ToString().c_str());
    return 1;
  }
  return 0;
}
