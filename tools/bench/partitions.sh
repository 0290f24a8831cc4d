#!/bin/bash
# Partitioned conversions on one machine: K workers (`reshardctl consolidate --partition I/K`,
# started together, as the tasks of a Slurm array on one node) against one worker and against
# `cp -r IN COPY && sync` of the same folder, run alternately (cp, K=1, K=2, ..., cp, ...) with
# the page cache dropped before each run. Prints medians: wall until the last worker ends, CPU
# (user + sys) summed over the workers, the largest worker's peak RSS, and the bytes each
# partition writes (from `plan --partitions K`).
#
#   tools/bench/partitions.sh [--size 4GiB] [--max-shard-size 500MB] [--counts 1,2,4]
#                             [--pairs 3] [--workdir DIR] [--reshardctl PATH] [-- ARGS...]
#
# Run as root on a quiet machine (docs/benchmarks.md, "Partitioned conversions").
set -euo pipefail

size=4GiB max_shard=500MB counts=1,2,4 pairs=3 workdir="" reshardctl=""
extra=()
while (($#)); do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --max-shard-size) max_shard=$2; shift 2 ;;
    --counts) counts=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --reshardctl) reshardctl=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ -z "$reshardctl" ]; then
  (cd "$repo" && bazel build -c opt //client:reshardctl >&2)
  reshardctl=$repo/bazel-bin/client/reshardctl
fi
[ -n "$workdir" ] || workdir=$(mktemp -d /tmp/reshard-partitions.XXXXXX)
mkdir -p "$workdir"
cleanup() { rm -rf "$workdir/in" "$workdir/out" "$workdir/copy"; }
trap cleanup EXIT

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "warning: page cache not dropped" >&2; }

echo "generating a $size checkpoint in $workdir/in" >&2
/usr/bin/python3 "$repo/tools/bench/make_checkpoint.py" --size "$size" --quiet "$workdir/in" >&2
IFS=, read -r -a ks <<<"$counts"
for k in "${ks[@]}"; do
  "$reshardctl" plan "$workdir/in" --max-shard-size "$max_shard" --partitions "$k" --json |
    /usr/bin/python3 -c '
import json, sys
doc = json.load(sys.stdin)
k = int(sys.argv[1])
sizes = [p["bytes"] / 2**20 for p in doc["partitions"]]
print("K=%d: %d data files; MiB per partition: %s" % (k, sum(len(p["files"]) for p in doc["partitions"]),
      ", ".join("%.0f" % s for s in sizes)))' "$k"
done

tsv=$workdir/runs.tsv
printf 'run\tpair\twall_s\tcpu_s\tpeak_rss_kib\n' >"$tsv"
run_cp() {
  rm -rf "$workdir/copy"
  drop_caches
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f '%U %S %M' -o "$workdir/time.cp" cp -r "$workdir/in" "$workdir/copy"
  sync
  end=$(date +%s.%N)
  read -r u s m <"$workdir/time.cp"
  printf 'cp\t%d\t%s\t%s\t%s\n' "$1" "$(echo "$end - $start" | bc)" "$(echo "$u + $s" | bc)" "$m" >>"$tsv"
}
run_k() {
  local k=$1 pair=$2 start end i pids=()
  rm -rf "$workdir/out" "$workdir/.out.reshard-partitions"
  drop_caches
  start=$(date +%s.%N)
  for ((i = 0; i < k; i++)); do
    /usr/bin/time -f '%U %S %M' -o "$workdir/time.$i" "$reshardctl" consolidate "$workdir/in" \
      "$workdir/out" --max-shard-size "$max_shard" --partition "$i/$k" --no-progress \
      "${extra[@]}" >/dev/null &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  sync
  end=$(date +%s.%N)
  [ -f "$workdir/out/reshard-manifest.json" ] || { echo "K=$k: the output was not published" >&2; exit 1; }
  local cpu=0 rss=0
  for ((i = 0; i < k; i++)); do
    read -r u s m <"$workdir/time.$i"
    cpu=$(echo "$cpu + $u + $s" | bc)
    ((m > rss)) && rss=$m
  done
  printf 'K=%d\t%d\t%s\t%s\t%s\n' "$k" "$pair" "$(echo "$end - $start" | bc)" "$cpu" "$rss" >>"$tsv"
}

for ((pair = 1; pair <= pairs; pair++)); do
  run_cp "$pair"
  for k in "${ks[@]}"; do run_k "$k" "$pair"; done
done

/usr/bin/python3 - "$tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
runs = sorted({r["run"] for r in rows}, key=lambda r: (r != "cp", r))
cp = {r["pair"]: float(r["wall_s"]) for r in rows if r["run"] == "cp"}
print("| run | pairs | wall s (median) | vs cp (pair by pair) | CPU s (sum of workers) | peak RSS MiB (largest worker) |")
print("| --- | --- | --- | --- | --- | --- |")
for run in runs:
    rs = [r for r in rows if r["run"] == run]
    wall = statistics.median(float(r["wall_s"]) for r in rs)
    ratio = statistics.median(float(r["wall_s"]) / cp[r["pair"]] for r in rs)
    cpu = statistics.median(float(r["cpu_s"]) for r in rs)
    rss = statistics.median(float(r["peak_rss_kib"]) for r in rs) / 1024
    print(f"| {run} | {len(rs)} | {wall:.2f} | {ratio:.2f}x | {cpu:.2f} | {rss:.1f} |")
print(f"(runs: {sys.argv[1]})")
PY
