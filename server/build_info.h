// The source revision reshardd was built from, for reshard_build_info{revision}.

#ifndef RESHARD_SERVER_BUILD_INFO_H_
#define RESHARD_SERVER_BUILD_INFO_H_

namespace reshard {

// Abbreviated git commit of the build (tools/workspace_status.sh through Bazel's stable
// status), or "unknown" when built without git.
const char* BuildRevision();

}  // namespace reshard

#endif  // RESHARD_SERVER_BUILD_INFO_H_
