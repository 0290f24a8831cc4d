#include "lib/io/remote_store.h"

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace reshard {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, RemoteStore*, std::less<>> stores ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: used from static initializers
  return *registry;
}

}  // namespace

void RegisterRemoteStore(absl::string_view scheme, RemoteStore* store) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.stores[std::string(scheme)] = store;
}

absl::StatusOr<RemoteStore*> RemoteStoreFor(absl::string_view url) {
  const size_t colon = url.find("://");
  const absl::string_view scheme = url.substr(0, colon == absl::string_view::npos ? 0 : colon);
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  auto it = registry.stores.find(scheme);
  if (it != registry.stores.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [name, store] : registry.stores) known.push_back(absl::StrCat(name, "://"));
  return absl::UnimplementedError(absl::StrCat(
      url, ": reshard reads no ", scheme, ":// storage",
      known.empty() ? std::string(" (this binary reads local paths only)")
                    : absl::StrCat(" (remote inputs: ", absl::StrJoin(known, ", "), ")")));
}

}  // namespace reshard
