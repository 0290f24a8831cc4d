#include "lib/core/test_faults.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace reshard {
namespace {

using FaultList = std::vector<std::pair<std::string, std::string>>;

// Read once: the environment of a running process does not change under it.
const FaultList& ConfiguredFaults() {
  static const FaultList* faults = [] {
    auto* list = new FaultList;
    const char* value = std::getenv(kTestFaultsVariable);
    if (value == nullptr) return list;
    for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> fault = absl::StrSplit(item, absl::MaxSplits('=', 1));
      list->push_back(std::move(fault));
    }
    return list;
  }();
  return *faults;
}

}  // namespace

void TestFaultPoint(absl::string_view point, const std::atomic<bool>* interrupted) {
  for (const auto& [name, action] : ConfiguredFaults()) {
    if (name != point) continue;
    if (action == "kill") {
      ::kill(::getpid(), SIGKILL);
      ::pause();
    }
    const bool wait = absl::StartsWith(action, "wait:");
    if (wait || absl::StartsWith(action, "block:")) {
      const std::string path = action.substr(action.find(':') + 1);
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      struct stat st;
      while (::stat(path.c_str(), &st) != 0 && absl::Now() < deadline &&
             (!wait || interrupted == nullptr || !interrupted->load())) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  }
}

}  // namespace reshard
