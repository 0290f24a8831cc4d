// Checks every Driver must pass, for the drivers' tests (tensorstore's kvstore test_util is the
// model).

#ifndef RESHARD_LIB_IO_KVSTORE_DRIVER_TESTUTIL_H_
#define RESHARD_LIB_IO_KVSTORE_DRIVER_TESTUTIL_H_

#include <map>
#include <string>

#include "lib/io/kvstore/driver.h"

namespace reshard {
namespace kvstore {

// Runs `threads` CreateExclusive calls of `path` at once, the i-th writing i + 1 bytes 'x', and
// expects (gtest) exactly one to succeed and the others to fail with AlreadyExists naming the
// path. Returns the winner's index, -1 when none won.
int RaceCreateExclusive(const Driver& driver, const std::string& path, int threads);

// Every file below folder `root` of `driver` (sub-folders too), named relative to it ("a/b"),
// with its bytes; empty when there is none. Failures are gtest failures.
std::map<std::string, std::string> ReadTree(const Driver& driver, const std::string& root);

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_DRIVER_TESTUTIL_H_
