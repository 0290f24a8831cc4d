// reshard's version: the one place it is written. The manifest, `reshardctl --version` and
// the daemon's reshard_build_info{version} metric all read it.

#ifndef RESHARD_LIB_CORE_VERSION_H_
#define RESHARD_LIB_CORE_VERSION_H_

namespace reshard {

inline constexpr char kReshardVersion[] = "0.1.0";

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_VERSION_H_
