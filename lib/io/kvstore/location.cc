#include "lib/io/kvstore/location.h"

#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/kvstore/posix_driver.h"

namespace reshard {
namespace kvstore {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, const Driver*, std::less<>> drivers ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  // Never destroyed: used from static initializers. "mem" is built in.
  static Registry* registry = [] {
    auto* made = new Registry;
    absl::MutexLock lock(&made->mu);
    made->drivers.emplace("mem", &GetMemoryDriver());
    return made;
  }();
  return *registry;
}

}  // namespace

void RegisterDriver(const Driver* driver) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.drivers[std::string(driver->scheme())] = driver;
}

absl::StatusOr<Location> ParseLocation(absl::string_view path) {
  const absl::string_view scheme = SchemeOf(path);
  if (scheme.empty()) return Location{&GetPosixDriver(), std::string(path)};
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  auto it = registry.drivers.find(scheme);
  if (it != registry.drivers.end()) return Location{it->second, std::string(path)};
  std::vector<std::string> known;
  for (const auto& [name, driver] : registry.drivers) known.push_back(absl::StrCat(name, "://"));
  return absl::UnimplementedError(absl::StrCat(path, ": reshard reads no ", scheme,
                                               ":// storage (storage URLs this binary reads: ",
                                               absl::StrJoin(known, ", "), ")"));
}

}  // namespace kvstore
}  // namespace reshard
