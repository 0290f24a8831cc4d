#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): prints the git revision of the source tree as
# STABLE_GIT_REVISION, which //server:build_info embeds in reshardd (reshard_build_info).
# Always succeeds: without git, or outside a clone, the revision is "unknown".
revision=$(git rev-parse --short=12 HEAD 2>/dev/null) || revision=""
case "$revision" in
  "" | *[!0-9a-f]*) revision=unknown ;;
esac
echo "STABLE_GIT_REVISION $revision"
