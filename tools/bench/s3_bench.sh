#!/usr/bin/env bash
# s3:// conversions against python3-boto3 transfers of the same bytes, on a real Ceph radosgw
# started here (lib/io/s3/testing/rgw.sh, data in RAM), in alternating pairs (boto3, reshard,
# boto3, reshard, ...), the page cache dropped before every run:
#
#   download: boto3 download_file of every object of the model + sync
#             vs reshardctl consolidate s3://bench/model OUT (same dtype; fsyncs its files)
#   upload:   boto3 upload_file of every file of the model
#             vs reshardctl consolidate MODEL s3://bench/out
#
# Prints the median wall time of each, the median of the pair-by-pair ratios, MB/s, user and
# kernel CPU and peak RSS of the client (GNU time; radosgw's own memory is not counted).
#
#   tools/bench/s3_bench.sh [--reshardctl PATH] [--size 1GiB] [--pairs 3] [--workdir DIR] [--keep]
#                           [--input-format safetensors|torch|zero3] [-- EXTRA_ARGS...]
#
# --input-format: the model read from S3 (and uploaded from local in the upload pair):
# safetensors (make_checkpoint.py, a Hugging Face sharded folder; default), torch (one
# pytorch_model.bin from make_torch_checkpoint.py: zip directory and pickle by range reads) or
# zero3 (a DeepSpeed ZeRO-3 save of 8 ranks from make_zero_checkpoint.py: a gather of one run
# per rank per parameter).
#
# EXTRA_ARGS are appended to both reshardctl conversions (e.g. -- --dtype bf16). Without
# --reshardctl the script builds `bazel build -c opt //client:reshardctl` and copies it.
# Run as root on a quiet machine (it drops the page cache); needs the packages of tools/setup.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3
size=1GiB
pairs=3
input_format=safetensors
workdir=
keep=0
reshardctl=
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; extra=("$@"); break ;;
    --size) size=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --input-format) input_format=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --reshardctl) reshardctl=$(realpath "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$workdir" ] || workdir=$(mktemp -d /tmp/s3bench.XXXXXX)
mkdir -p "$workdir"
if [ -z "$reshardctl" ]; then
  (cd "$ROOT" && bazel build -c opt //client:reshardctl >/dev/null 2>&1)
  reshardctl="$ROOT/bazel-bin/client/reshardctl"
fi
cp "$reshardctl" "$workdir/reshardctl"  # a concurrent rebuild cannot swap it mid-run
reshardctl="$workdir/reshardctl"
rgw_base=$(mktemp -d /tmp/rgwb.XXXXXX)  # short: Ceph's admin sockets live under it

bytes=$($PY -c "
import re,sys
m=re.fullmatch(r'(\d+)(KiB|MiB|GiB|KB|MB|GB)?', sys.argv[1])
u={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30,'KB':10**3,'MB':10**6,'GB':10**9,None:1}[m.group(2)]
print(int(m.group(1))*u)" "$size")
# The model, one reshard upload at a time, and the garbage radosgw collects late.
export RGW_MEMSTORE_BYTES=$(( bytes * (3 + 2 * pairs) + (1 << 30) ))

cleanup() {
  "$ROOT/lib/io/s3/testing/rgw.sh" stop "$rgw_base" >/dev/null 2>&1 || true
  rm -rf "$rgw_base"
  [ "$keep" = 1 ] || rm -rf "$workdir"
}
trap cleanup EXIT

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rgw_port=$(free_port)
mon_port=$(free_port)
"$ROOT/lib/io/s3/testing/rgw.sh" start "$rgw_base" "$rgw_port" "$mon_port"
endpoint="http://127.0.0.1:$rgw_port"
export AWS_ACCESS_KEY_ID=TESTKEY AWS_SECRET_ACCESS_KEY=TESTSECRET AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=$endpoint
boto() { $PY "$HERE/boto3_transfer.py" "$endpoint" "$@"; }

case "$input_format" in
  safetensors) $PY "$HERE/make_checkpoint.py" --size "$size" --quiet "$workdir/model" >/dev/null ;;
  torch)
    mkdir -p "$workdir/model"
    $PY "$HERE/make_torch_checkpoint.py" --size "$size" --quiet "$workdir/model/pytorch_model.bin" \
      >/dev/null ;;
  zero3)
    $PY "$HERE/make_zero_checkpoint.py" --size "$size" --quiet --ranks 8 --stage 3 \
      "$workdir/model" >/dev/null ;;
  *) echo "--input-format: safetensors, torch or zero3, not $input_format" >&2; exit 2 ;;
esac
model_bytes=$(du -sb "$workdir/model" | cut -f1)
boto mkbucket bench
boto upload "$workdir/model" bench model
echo "model: $size of tensors ($input_format), $model_bytes bytes in $(find "$workdir/model" -type f | wc -l) files; radosgw on $endpoint"

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# timed NAME CMD...: runs CMD under GNU time; appends "NAME wall user sys rss_kib" to runs.tsv.
timed() {
  local name=$1
  shift
  drop_caches
  /usr/bin/time -v -o "$workdir/time.txt" "$@" >"$workdir/out.txt" 2>&1 || {
    echo "FAILED: $*" >&2; cat "$workdir/out.txt" >&2; exit 1; }
  $PY - "$name" "$workdir/time.txt" >>"$workdir/runs.tsv" <<'PY'
import sys
name, path = sys.argv[1:3]
v = {}
for line in open(path):
    k, _, val = line.strip().rpartition(": ")
    v[k] = val
w = v["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":")
wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
print(name, wall, v["User time (seconds)"], v["System time (seconds)"],
      v["Maximum resident set size (kbytes)"], sep="\t")
PY
}

: >"$workdir/runs.tsv"
for i in $(seq "$pairs"); do
  timed download-boto3 sh -c "$PY '$HERE/boto3_transfer.py' '$endpoint' download bench model '$workdir/dl-boto3' && sync"
  rm -rf "$workdir/dl-boto3"
  timed download-reshard "$reshardctl" consolidate s3://bench/model "$workdir/dl-reshard" --no-progress "${extra[@]}"
  rm -rf "$workdir/dl-reshard"
  timed upload-boto3 "$PY" "$HERE/boto3_transfer.py" "$endpoint" upload "$workdir/model" bench up-boto3
  boto delete bench up-boto3
  timed upload-reshard "$reshardctl" consolidate "$workdir/model" s3://bench/up-reshard --no-progress "${extra[@]}"
  boto delete bench up-reshard
done

$PY - "$workdir/runs.tsv" "$model_bytes" "$pairs" <<'PY'
import statistics, sys
path, total, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {}
for line in open(path):
    name, wall, user, sys_, rss = line.split("\t")
    runs.setdefault(name, []).append((float(wall), float(user), float(sys_), int(rss) / 1024))
med = lambda xs: statistics.median(xs)
print("| direction | client | wall s | MB/s | reshard/boto3 (pairs) | user / sys s | peak RSS MiB |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for direction in ("download", "upload"):
    b, r = runs[f"{direction}-boto3"], runs[f"{direction}-reshard"]
    ratios = sorted(rr[0] / bb[0] for bb, rr in zip(b, r))
    for client, rs in (("boto3", b), ("reshard", r)):
        wall = med([x[0] for x in rs])
        ratio = (f"{med(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})" if client == "reshard" else "")
        print(f"| {direction} | {client} | {wall:.2f} | {total / wall / 1e6:.0f} | {ratio} | "
              f"{med([x[1] for x in rs]):.2f} / {med([x[2] for x in rs]):.2f} | "
              f"{max(x[3] for x in rs):.1f} |")
PY
