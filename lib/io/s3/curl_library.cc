#include "lib/io/s3/curl_library.h"

#include <dlfcn.h>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace reshard {
namespace {

// Looks `name` up in `handle` into `*function`; false (and `*error` set) when it is missing.
template <typename Function>
bool Resolve(void* handle, const char* name, Function* function, std::string* error) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    const char* reason = dlerror();
    *error = absl::StrCat(kCurlLibraryName, " has no ", name, ": ",
                          reason != nullptr ? reason : "symbol not found");
    return false;
  }
  *function = reinterpret_cast<Function>(symbol);
  return true;
}

absl::StatusOr<const CurlLibrary*> Load() {
  // RTLD_LOCAL: libcurl's symbols (and its dependencies') stay out of the global namespace.
  void* handle = dlopen(kCurlLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", kCurlLibraryName, " for s3:// paths (is libcurl4 installed?): ",
        reason != nullptr ? reason : "unknown reason"));
  }
  static CurlLibrary library;
  std::string error;
  CURLcode (*global_init)(long) = nullptr;
  if (!Resolve(handle, "curl_global_init", &global_init, &error) ||
      !Resolve(handle, "curl_easy_init", &library.easy_init, &error) ||
      !Resolve(handle, "curl_easy_cleanup", &library.easy_cleanup, &error) ||
      !Resolve(handle, "curl_easy_reset", &library.easy_reset, &error) ||
      !Resolve(handle, "curl_easy_setopt", &library.easy_setopt, &error) ||
      !Resolve(handle, "curl_easy_getinfo", &library.easy_getinfo, &error) ||
      !Resolve(handle, "curl_easy_perform", &library.easy_perform, &error) ||
      !Resolve(handle, "curl_easy_strerror", &library.easy_strerror, &error) ||
      !Resolve(handle, "curl_slist_append", &library.slist_append, &error) ||
      !Resolve(handle, "curl_slist_free_all", &library.slist_free_all, &error)) {
    return absl::FailedPreconditionError(error);
  }
  const CURLcode init = global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_global_init: ", library.easy_strerror(init)));
  }
  return &library;
}

}  // namespace

absl::StatusOr<const CurlLibrary*> LoadCurlLibrary() {
  static absl::once_flag once;
  static absl::StatusOr<const CurlLibrary*>* loaded = nullptr;
  absl::call_once(once, [] { loaded = new absl::StatusOr<const CurlLibrary*>(Load()); });
  return *loaded;
}

}  // namespace reshard
