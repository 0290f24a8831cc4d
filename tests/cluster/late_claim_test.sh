#!/bin/bash
# Two partition workers that both see every record: the one that claims publishes and removes
# the shared area while the other is about to claim. The late one must finish without error
# and without publishing, and the output must equal one worker's. (This race failed CI once,
# as NOT_FOUND from the late worker's claim inside the removed area.)
#
# The late worker is held at the fault point "partition-before-claim" until the other has
# published, so the interleaving is the same on every run.
#
# Flags (tests/e2e.bzl): --reshardctl PATH --make-checkpoint PATH --same-output PATH
set -euo pipefail
# Each flag's PATH, absolute, in the variable of its name (--make-checkpoint: make_checkpoint);
# set -u stops the script at the first use of a flag not given.
while [ $# -ge 2 ]; do
  printf -v "$(tr - _ <<<"${1#--}")" %s "$(realpath "$2")"
  shift 2
done
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/late_claim.XXXXXX")
late_pid=
trap '[ -z "$late_pid" ] || kill "$late_pid" 2>/dev/null || true; rm -rf "$work"' EXIT

/usr/bin/python3 "$make_checkpoint" --size 8MiB --quiet "$work/in" >/dev/null
"$reshardctl" consolidate "$work/in" "$work/ref" --max-shard-size 2MiB --no-progress >/dev/null
run() {  # run INDEX RESULT_FILE [env...]
  local index=$1 result=$2
  shift 2
  env "$@" "$reshardctl" consolidate "$work/in" "$work/out" --max-shard-size 2MiB \
    --partition "$index/2" --no-progress --json >"$result"
}

# Worker 0 records its files; it sees one record of two and leaves.
run 0 "$work/w0.json"
# Worker 1 records its files, sees both records, and waits before claiming.
run 1 "$work/w1.json" "RESHARD_TEST_FAULTS=partition-before-claim=wait:$work/release" &
late_pid=$!
area=$work/.out.reshard-partitions
for _ in $(seq 600); do
  [ -e "$area/partition-00001-of-00002.json" ] && break
  sleep 0.1
done
[ -e "$area/partition-00001-of-00002.json" ] || { echo "FAIL: worker 1 did not record"; exit 1; }
# Worker 0 again: it finds its files committed, sees both records, claims and publishes, and
# removes the area.
run 0 "$work/w0-again.json"
[ ! -e "$area" ] || { echo "FAIL: the area was not removed after publishing"; exit 1; }
touch "$work/release"
wait "$late_pid" || { echo "FAIL: the late worker failed:"; cat "$work/w1.json"; exit 1; }
late_pid=

/usr/bin/python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
first = json.load(open(os.path.join(work, "w0.json")))
again = json.load(open(os.path.join(work, "w0-again.json")))
late = json.load(open(os.path.join(work, "w1.json")))
assert not first["published"], first
assert again["published"], again
assert not late["published"] and late["partition"]["recorded"] == 2, late
print("the late worker finished without publishing")
PY
/usr/bin/python3 "$same_output" "$work/ref" "$work/out"
echo PASS
