#!/bin/bash
# A partition worker killed with SIGKILL mid-way (no chance to clean up, unlike scancel's
# SIGTERM in slurm_test) publishes nothing and records nothing; rerunning the same index reuses
# the files it recorded (the lines of its log data/.reshard-progress/records-partition-00001-
# of-00002.jsonl: each keeps its inode; a rewritten file is a new one renamed over it) and
# publishes an output equal to a single worker's.
#
# Flags (tests/e2e.bzl): --reshardctl PATH --make-checkpoint PATH --same-output PATH
set -euo pipefail
# Each flag's PATH, absolute, in the variable of its name (--make-checkpoint: make_checkpoint);
# set -u stops the script at the first use of a flag not given.
while [ $# -ge 2 ]; do
  printf -v "$(tr - _ <<<"${1#--}")" %s "$(realpath "$2")"
  shift 2
done
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/killed.XXXXXX")
victim_pid=
trap '[ -z "$victim_pid" ] || kill -9 "$victim_pid" 2>/dev/null || true; rm -rf "$work"' EXIT

/usr/bin/python3 "$make_checkpoint" --size 8MiB --quiet "$work/in" >/dev/null
"$reshardctl" consolidate "$work/in" "$work/ref" --max-shard-size 1MiB --no-progress >/dev/null
run() {  # run INDEX RESULT_FILE [env...]; with RUN_EXEC=exec the shell becomes the worker
  local index=$1 result=$2
  shift 2
  ${RUN_EXEC:-} env "$@" "$reshardctl" consolidate "$work/in" "$work/out" --max-shard-size 1MiB \
    --partition "$index/2" --no-progress --json >"$result"
}

# Worker 1 stops after its first committed file (the fault point never releases) and is killed.
# The background subshell execs the worker, so that $! is the worker's pid: killing a shell
# around it would leave the worker running, holding its partition's claim.
(RUN_EXEC=exec run 1 "$work/killed.json" "RESHARD_TEST_FAULTS=partition-file-committed=wait:$work/never") &
victim_pid=$!
area=$work/.out.reshard-partitions
records=$area/data/.reshard-progress
log=$records/records-partition-00001-of-00002.jsonl
recorded() { [ -s "$log" ]; }
for _ in $(seq 600); do
  recorded && break
  sleep 0.1
done
recorded || { echo "FAIL: worker 1 committed no file"; exit 1; }
kill -9 "$victim_pid"
wait "$victim_pid" 2>/dev/null || true
victim_pid=
[ ! -e "$area/partition-00001-of-00002.json" ] || { echo "FAIL: the killed worker recorded"; exit 1; }
[ ! -e "$work/out" ] || { echo "FAIL: the output was published by a killed worker"; exit 1; }
# The worker's log is all the records folder holds: one line per finished file.
[ "$(ls -A "$records")" = "$(basename "$log")" ] || { echo "FAIL: $records: $(ls -A "$records")"; exit 1; }
committed=$(/usr/bin/python3 -c '
import json, sys
print(" ".join(json.loads(line)["name"] for line in open(sys.argv[1]) if line.strip()))' "$log")
[ -n "$committed" ] || { echo "FAIL: no file record names a file"; exit 1; }
# Each file's inode: a file written again is a new file renamed over the old one.
declare -A inode
for name in $committed; do inode[$name]=$(stat -c %i "$area/data/$name"); done

# Worker 0 records its files; partition 1 is missing, so nothing is published.
run 0 "$work/w0.json"
[ ! -e "$work/out" ] || { echo "FAIL: published without partition 1"; exit 1; }
# The rerun of worker 1 reuses its committed files, records and publishes.
run 1 "$work/rerun.json"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["published"] and r["partition"] == {"index": 1, "count": 2, "recorded": 2}, r' \
  "$work/rerun.json"
for name in $committed; do
  [ "$(stat -c %i "$work/out/$name")" = "${inode[$name]}" ] ||
    { echo "FAIL: $name was rewritten by the rerun instead of reused"; exit 1; }
done
/usr/bin/python3 "$same_output" "$work/ref" "$work/out"
echo "killed worker: nothing published; the rerun reused $committed and published"
echo PASS
