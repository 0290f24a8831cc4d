// The URL scheme of a path ("s3" of "s3://bucket/key"), the one thing ParseLocation reads from a
// path's spelling. Separate from location.h so that the posix layer below the drivers
// (lib/io/path_confinement.h) can refuse URLs without depending on the driver registry.

#ifndef RESHARD_LIB_IO_KVSTORE_SCHEME_H_
#define RESHARD_LIB_IO_KVSTORE_SCHEME_H_

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace reshard {
namespace kvstore {

// The scheme of `path` when it has one (letters, digits, '+', '.' and '-' before "://",
// starting with a letter); empty otherwise (a posix path).
inline absl::string_view SchemeOf(absl::string_view path) {
  const size_t colon = path.find("://");
  if (colon == absl::string_view::npos || colon == 0) return {};
  if (!absl::ascii_isalpha(static_cast<unsigned char>(path[0]))) return {};
  for (size_t i = 1; i < colon; ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (!absl::ascii_isalnum(c) && c != '+' && c != '.' && c != '-') return {};
  }
  return path.substr(0, colon);
}

// Whether `path` has a URL scheme.
inline bool HasScheme(absl::string_view path) { return !SchemeOf(path).empty(); }

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_SCHEME_H_
