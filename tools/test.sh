#!/usr/bin/env bash
# The test command (README): installs what the project needs, builds everything, runs every
# test (unit, end-to-end with real PyTorch, crash tests) and the fuzzers for a bounded time.
#   tools/test.sh                       # all tests + 30 s per fuzz target
#   RESHARD_FUZZ_SECONDS=120 tools/test.sh
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools/setup.sh || exit 1

log="$(mktemp /tmp/reshard-test.XXXXXX.log)"
bazel test //... --test_output=errors 2>&1 | tee "$log"
bazel_status=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)

fuzz_status=0
tests/fuzz/run_fuzzers.sh "${RESHARD_FUZZ_SECONDS:-30}" || fuzz_status=$?
if [ "$fuzz_status" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
# The README runs bazel-bin/client/reshardctl after this script: the fuzz build must leave
# bazel-bin on the normal build.
if [ ! -x bazel-bin/client/reshardctl ]; then
  echo "bazel-bin/client/reshardctl is missing after the fuzzers (bazel-bin -> $(readlink bazel-bin))" >&2
  failed=$((failed + 1))
fi

rm -f "$log"
echo "tests: $passed passed, $failed failed"
if [ "$bazel_status" -ne 0 ] || [ "$fuzz_status" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$passed" -eq 0 ]; then
  exit 1
fi
