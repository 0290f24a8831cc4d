// A path parsed once, at the edge, into the driver that serves it.
//
//   ASSIGN_OR_RETURN(kvstore::Location input, kvstore::ParseLocation(path));
//   ASSIGN_OR_RETURN(kvstore::PathStat stat, input.driver->Stat(input.path));
//
// "scheme://..." goes to the driver registered for the scheme ("s3" by lib/io/s3:s3_store,
// which binaries that read S3 link; "mem" is built in), anything else to the posix driver. A
// driver registers itself from a file-scope object:
//
//   const kvstore::DriverRegistration<S3Store> register_s3;

#ifndef RESHARD_LIB_IO_KVSTORE_LOCATION_H_
#define RESHARD_LIB_IO_KVSTORE_LOCATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/kvstore/scheme.h"

namespace reshard {
namespace kvstore {

struct Location {
  const Driver* driver = nullptr;  // never destroyed
  std::string path;                // as the user gave it: what the driver and errors see
};

// The Location of `path`. Unimplemented naming the path and the schemes this binary serves
// when its scheme has no driver here.
absl::StatusOr<Location> ParseLocation(absl::string_view path);

// Registers `driver` (never destroyed) for paths "`driver->scheme()`://...". A later
// registration for the same scheme replaces the earlier one (tests). Thread safe.
void RegisterDriver(const Driver* driver);

// Registers `T` (default-constructed) from a file-scope object.
template <typename T>
struct DriverRegistration {
  DriverRegistration() { RegisterDriver(new T()); }
};

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_LOCATION_H_
