#!/bin/bash
# s3:// input throughput: `reshardctl consolidate s3://... OUT` against boto3's download_file of
# the same objects (python3-boto3: 10 threads, 8 MiB parts), both ending with the bytes on the
# local disk and fsynced, alternating run by run; medians of wall time and peak RSS.
# The objects live in a local Ceph radosgw (memstore OSD, so at most about 1.5 GiB) started here
# with lib/io/s3/testing/rgw.sh and stopped on exit.
#
#   tools/bench/s3_input_bench.sh [--size 1GiB] [--pairs 5] [--reshardctl PATH] [-- ARGS...]
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
size=1GiB
pairs=5
reshardctl=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --reshardctl) reshardctl=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--size SIZE] [--pairs N] [--reshardctl PATH] [-- ARGS...]" >&2; exit 2 ;;
  esac
done
if [ -z "$reshardctl" ]; then
  (cd "$repo" && bazel build -c opt //client:reshardctl >/dev/null)
  reshardctl="$repo/bazel-bin/client/reshardctl"
fi

work=$(mktemp -d /tmp/reshard-s3bench.XXXXXX)
base=$(mktemp -d /tmp/rgw.XXXXXX)
cleanup() {
  "$repo/lib/io/s3/testing/rgw.sh" stop "$base" >/dev/null 2>&1 || true
  rm -rf "$base" "$work"
}
trap cleanup EXIT
cp "$reshardctl" "$work/reshardctl"  # a concurrent rebuild cannot swap it mid-run

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rgw_port=$(free_port)
mon_port=$(free_port)
"$repo/lib/io/s3/testing/rgw.sh" start "$base" "$rgw_port" "$mon_port" >/dev/null 2>&1
export AWS_ACCESS_KEY_ID=TESTKEY AWS_SECRET_ACCESS_KEY=TESTSECRET AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$rgw_port"

/usr/bin/python3 "$repo/tools/bench/make_checkpoint.py" "$work/model" --size "$size" --quiet
cat >"$work/s3.py" <<'PY'
import os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                  config=Config(s3={"addressing_style": "path"}))
if sys.argv[1] == "upload":
    s3.create_bucket(Bucket="bench")
    for name in sorted(os.listdir(sys.argv[2])):
        s3.upload_file(os.path.join(sys.argv[2], name), "bench", "model/" + name)
else:  # download into sys.argv[2], then fsync every file (reshardctl's outputs are fsynced)
    os.makedirs(sys.argv[2])
    for o in s3.list_objects_v2(Bucket="bench", Prefix="model/")["Contents"]:
        path = os.path.join(sys.argv[2], os.path.basename(o["Key"]))
        s3.download_file("bench", o["Key"], path)
        fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)
PY
/usr/bin/python3 "$work/s3.py" upload "$work/model"
bytes=$(du -sb "$work/model" | cut -f1)
rm -rf "$work/model"

run() {  # run NAME CMD...: appends "seconds peak_kib" to $work/NAME.txt
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" >/dev/null
  cat "$work/time.txt" >>"$work/$name.txt"
}
for i in $(seq 1 "$pairs"); do
  rm -rf "$work/dl" "$work/out"
  run boto3 /usr/bin/python3 "$work/s3.py" download "$work/dl"
  rm -rf "$work/dl"
  run reshardctl "$work/reshardctl" consolidate s3://bench/model "$work/out" --no-progress \
    "${extra[@]}"
done
echo "s3 -> local, $((bytes >> 20)) MiB, $pairs runs each, medians (git $(cd "$repo" && git rev-parse --short HEAD)):"
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for name in boto3 reshardctl; do
  seconds=$(cut -d' ' -f1 "$work/$name.txt" | median)
  peak_kib=$(cut -d' ' -f2 "$work/$name.txt" | median)
  awk -v n="$name" -v s="$seconds" -v k="$peak_kib" -v b="$bytes" 'BEGIN {
    printf "  %-10s %6.2f s  %6.0f MiB/s  peak RSS %4.0f MiB\n", n, s, b / 1048576 / s, k / 1024 }'
done
