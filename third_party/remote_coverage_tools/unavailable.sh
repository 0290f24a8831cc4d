#!/bin/sh
echo "bazel coverage is not available offline in this workspace" >&2
exit 1
