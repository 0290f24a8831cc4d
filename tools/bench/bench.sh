#!/usr/bin/env bash
# Benchmark of `reshardctl consolidate` against a plain `cp -r && sync` of the same checkpoint.
# See tools/bench/README.md. Usage:
#
#   tools/bench/bench.sh [--size 4GiB] [--sizes 1GiB,4GiB] [--repeat N] [--workdir DIR] [--keep]
#                        [--verify] [--steps cp,fp32,bf16,torch,universal] [--no-drop-caches]
#                        [--input-format safetensors|torch|zero1|zero2|zero3] [--zero-ranks N]
#                        [--zero-moments]
#                        [--reshardctl PATH]
#                        [-- EXTRA_ARGS...]
#
# EXTRA_ARGS (after --) are appended to both consolidate commands, e.g. -- --threads 2.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3   # not the pyenv shim first on PATH: Debian's python3 has numpy
TIME=/usr/bin/time

usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"
  cat <<'EOF'
Options:
  --size SIZE        checkpoint size for the main table (default 4GiB; KiB/MiB/GiB or KB/MB/GB)
  --sizes S1,S2,...  also measure consolidate (fp32) peak RSS at each of these sizes
  --repeat N         run every measurement N times, report the best wall time (default 1)
  --workdir DIR      where checkpoints and outputs go (default: a new folder under /tmp)
  --keep             keep the checkpoints and outputs (default: delete every big file at the end)
  --verify           after each conversion run `reshardctl verify IN OUT` (must exit 0) and an
                     independent format check of OUT (check_checkpoint.py)
  --steps LIST       which of cp,fp32,bf16,torch to run in the main table (default
                     cp,fp32,bf16; with --input-format torch: cp,fp32,bf16,torch).
                     torch = consolidate --format torch (writes pytorch_model.bin);
                     universal = consolidate --format deepspeed-universal (zero inputs with
                     --zero-moments; reads every byte of the checkpoint, like cp -r)
  --input-format F   safetensors (default: HF sharded folder from make_checkpoint.py),
                     torch (one torch.save file from make_torch_checkpoint.py; needs
                     python3-torch and about the checkpoint size in RAM to generate) or
                     zero3 (a DeepSpeed ZeRO-3 save folder from make_zero_checkpoint.py:
                     SIZE bytes of fp32 parameters partitioned over --zero-ranks ranks, no
                     Adam moments, so `cp -r` copies the same bytes reshard reads)
                     zero1, zero2: the same with ZeRO-1/2's flat partitions
  --zero-ranks N     data-parallel ranks of the zero checkpoint (default 8)
  --zero-moments     the zero checkpoint also holds Adam's moments (SIZE is then the fp32
                     weights; the folder holds about 3 x SIZE)
  --no-drop-caches   do not drop the page cache; warm the input instead
  --reshardctl PATH  use this binary instead of building //client:reshardctl with -c opt
EOF
}

die() { echo "bench: error: $*" >&2; exit 1; }
note() { echo "bench: $*" >&2; }

SIZE_ARG=4GiB
SIZES_ARG=""
REPEAT=1
WORK=""
KEEP=0
VERIFY=0
STEPS=""
INPUT_FORMAT=safetensors
ZERO_RANKS=8
ZERO_MOMENTS=0
BIN_ARG=""
DROP=1
EXTRA=()
while (($#)); do
  case "$1" in
    --size) SIZE_ARG="${2:?--size needs a value}"; shift 2 ;;
    --size=*) SIZE_ARG="${1#*=}"; shift ;;
    --sizes) SIZES_ARG="${2:?--sizes needs a value}"; shift 2 ;;
    --sizes=*) SIZES_ARG="${1#*=}"; shift ;;
    --repeat) REPEAT="${2:?--repeat needs a value}"; shift 2 ;;
    --repeat=*) REPEAT="${1#*=}"; shift ;;
    --workdir) WORK="${2:?--workdir needs a value}"; shift 2 ;;
    --workdir=*) WORK="${1#*=}"; shift ;;
    --keep) KEEP=1; shift ;;
    --verify) VERIFY=1; shift ;;
    --no-drop-caches) DROP=0; shift ;;
    --steps) STEPS="${2:?--steps needs a value}"; shift 2 ;;
    --steps=*) STEPS="${1#*=}"; shift ;;
    --input-format) INPUT_FORMAT="${2:?--input-format needs a value}"; shift 2 ;;
    --input-format=*) INPUT_FORMAT="${1#*=}"; shift ;;
    --zero-ranks) ZERO_RANKS="${2:?--zero-ranks needs a value}"; shift 2 ;;
    --zero-moments) ZERO_MOMENTS=1; shift ;;
    --zero-ranks=*) ZERO_RANKS="${1#*=}"; shift ;;
    --reshardctl) BIN_ARG="${2:?--reshardctl needs a value}"; shift 2 ;;
    --reshardctl=*) BIN_ARG="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer"
case "$INPUT_FORMAT" in
  safetensors) STEPS="${STEPS:-cp,fp32,bf16}" ;;
  torch|zero1|zero2|zero3) STEPS="${STEPS:-cp,fp32,bf16,torch}" ;;
  *) die "--input-format: unknown format '$INPUT_FORMAT' (use safetensors, torch, zero1, zero2 or zero3)" ;;
esac
for s in ${STEPS//,/ }; do
  case "$s" in cp|fp32|bf16|torch|universal) ;; *) die "--steps: unknown step '$s' (use cp,fp32,bf16,torch,universal)" ;; esac
done
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }

[ -x "$TIME" ] || die "$TIME not found (GNU time; run tools/setup.sh or apt-get install time)"
[ -x "$PY" ] || die "$PY not found (run tools/setup.sh)"
"$PY" -c 'import numpy' 2>/dev/null || die "numpy missing for $PY (apt-get install python3-numpy)"
[[ "$ZERO_RANKS" =~ ^[1-9][0-9]*$ ]] || die "--zero-ranks must be a positive integer"
if [ "$INPUT_FORMAT" != safetensors ]; then
  "$PY" -c 'import torch' 2>/dev/null || die "torch missing for $PY (apt-get install python3-torch)"
fi

to_bytes() {
  "$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import make_checkpoint as m; print(m.parse_size(sys.argv[2]))' \
    "$HERE" "$1" 2>/dev/null || die "bad size '$1' (use e.g. 4GiB, 512MiB, 2GB)"
}
SIZE_BYTES="$(to_bytes "$SIZE_ARG")"
SIZES=()
SIZES_BYTES=()
if [ -n "$SIZES_ARG" ]; then
  IFS=, read -r -a SIZES <<<"$SIZES_ARG"
  for s in "${SIZES[@]}"; do SIZES_BYTES+=("$(to_bytes "$s")"); done
fi
MAX_BYTES="$SIZE_BYTES"
for b in "${SIZES_BYTES[@]}"; do ((b > MAX_BYTES)) && MAX_BYTES=$b; done

# ---------------------------------------------------------------- workdir, free space, cleanup
# Free space first (on the folder or its nearest existing parent), so a failed check leaves nothing.
probe="${WORK:-/tmp}"
while [ ! -d "$probe" ]; do probe="$(dirname "$probe")"; done
AVAIL="$(df -P -B1 "$probe" | awk 'NR==2 {print $4}')"
NEED=$((3 * MAX_BYTES))                        # input + output + copy, with room to spare
((KEEP)) && NEED=$((5 * MAX_BYTES))            # --keep leaves input, copy and every output
if ((AVAIL < NEED)); then
  die "$probe has $((AVAIL >> 20)) MiB free, need about $((NEED >> 20)) MiB for a $((MAX_BYTES >> 20)) MiB checkpoint"
fi
if [ -z "$WORK" ]; then
  WORK="$(mktemp -d /tmp/reshard-bench.XXXXXX)"
else
  mkdir -p "$WORK"
  WORK="$(cd "$WORK" && pwd)"
fi
mkdir -p "$WORK/logs"

BIG=()   # big folders this run created; removed at exit unless --keep
add_big() { [[ " ${BIG[*]} " == *" $1 "* ]] || BIG+=("$1"); }
cleanup() {
  local rc=$?
  if ((KEEP)); then
    ((${#BIG[@]})) && note "kept (--keep): ${BIG[*]}"
  else
    for d in "${BIG[@]}"; do
      rm -rf -- "$d" "$(dirname "$d")/.$(basename "$d").reshard-staging"
    done
    rm -f -- "$WORK/reshardctl"
  fi
  note "logs in $WORK/logs"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm_out() {  # an output folder and reshard's staging sibling
  rm -rf -- "$1" "$(dirname "$1")/.$(basename "$1").reshard-staging"
}

# ---------------------------------------------------------------- build
if [ -n "$BIN_ARG" ]; then
  [ -x "$BIN_ARG" ] || die "--reshardctl $BIN_ARG is not an executable"
  SRC_BIN="$(cd "$(dirname "$BIN_ARG")" && pwd)/$(basename "$BIN_ARG")"
else
  note "building: (cd $ROOT && bazel build -c opt //client:reshardctl)"
  (cd "$ROOT" && bazel build -c opt //client:reshardctl) >"$WORK/logs/build.log" 2>&1 ||
    { tail -n 30 "$WORK/logs/build.log" >&2; die "bazel build failed (log: $WORK/logs/build.log)"; }
  # The exact -c opt output, even if another build has since moved the bazel-bin symlink.
  OPT_BIN_DIR="$(cd "$ROOT" && bazel info -c opt bazel-bin 2>/dev/null)" || OPT_BIN_DIR="$ROOT/bazel-bin"
  SRC_BIN="$OPT_BIN_DIR/client/reshardctl"
  [ -x "$SRC_BIN" ] || die "built binary not found at $SRC_BIN"
fi
# A private copy so a concurrent rebuild cannot swap the binary under the benchmark.
BIN="$WORK/reshardctl"
cp -f "$SRC_BIN" "$BIN"

# ---------------------------------------------------------------- machine
git_rev() {
  local rev
  rev="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null)" || { echo "(no commit)"; return; }
  if [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]; then rev+="+dirty"; fi
  echo "$rev"
}
FS="$(df -P -T "$WORK" | awk 'NR==2 {print $2 " on " $1 " (" $7 ")"}')"
MEM_KB="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
CPU_MODEL="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
echo "== reshard benchmark"
echo "date:       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "git:        $(git_rev)"
echo "binary:     $SRC_BIN"
echo "machine:    nproc=$(nproc), memory=$((MEM_KB / 1024)) MiB, cpu=${CPU_MODEL:-?}, kernel=$(uname -r)"
echo "workdir:    $WORK, filesystem $FS, $((AVAIL >> 30)) GiB free"
echo "repeat:     $REPEAT (best wall time reported; peak RSS is the max over the repeats)"
((${#EXTRA[@]})) && echo "extra args: ${EXTRA[*]}"

# ---------------------------------------------------------------- page cache
CACHE_MODE=""
drop_caches() {  # returns 0 if the page cache was dropped
  sync
  ((DROP)) && { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null
}
if drop_caches; then
  CACHE_MODE="cold"
  echo "page cache: dropped before every measured run (cold reads)"
else
  CACHE_MODE="warm"
  if ((DROP)); then why="/proc/sys/vm/drop_caches not writable"; else why="--no-drop-caches"; fi
  echo "page cache: NOT dropped ($why); input is read once"
  echo "            before the baseline so every run sees it cached (warm reads)"
fi
prepare_cache() {
  if [ "$CACHE_MODE" = cold ]; then drop_caches || note "warning: drop_caches failed"; else sync; fi
}
warm_input() {  # a folder (safetensors) or one file (torch)
  if [ "$CACHE_MODE" = warm ]; then
    if [ -d "$1" ]; then find "$1" -type f -exec cat {} + >/dev/null; else cat "$1" >/dev/null; fi
  fi
  return 0
}

# ---------------------------------------------------------------- checkpoint
dir_bytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'; }

# The input path for a size: a folder of safetensors shards, or one torch.save file.
input_path() {  # SIZE_ARG
  if [ "$INPUT_FORMAT" = torch ]; then echo "$WORK/in-$1.pt"; else echo "$WORK/in-$1"; fi
}

make_checkpoint() {  # SIZE_ARG PATH
  local size="$1" dir="$2"
  rm -rf -- "$dir"
  add_big "$dir"
  note "generating ${size} $INPUT_FORMAT checkpoint at $dir"
  local t0 t1 summary
  t0=$(date +%s.%N)
  if [ "$INPUT_FORMAT" = torch ]; then
    summary="$("$PY" "$HERE/make_torch_checkpoint.py" --quiet --size "$size" "$dir")" ||
      die "make_torch_checkpoint.py failed"
  elif [[ "$INPUT_FORMAT" == zero? ]]; then
    summary="$("$PY" "$HERE/make_zero_checkpoint.py" --quiet --size "$size" --ranks "$ZERO_RANKS" \
      --stage "${INPUT_FORMAT#zero}" $( ((ZERO_MOMENTS)) && echo --with-moments) "$dir")" ||
      die "make_zero_checkpoint.py failed"
  else
    summary="$("$PY" "$HERE/make_checkpoint.py" --quiet --size "$size" "$dir")" ||
      die "make_checkpoint.py failed"
  fi
  sync
  t1=$(date +%s.%N)
  if [ "$INPUT_FORMAT" = torch ]; then
    # Structure only (central directory, data.pkl, stored records); the data was just written.
    "$PY" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); names = z.namelist()
assert any(n.endswith("/data.pkl") for n in names), "no data.pkl"
assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist()), "compressed record"
print("%d records" % len(names))' "$dir" >"$WORK/logs/check-input-$size.log" 2>&1 ||
      { cat "$WORK/logs/check-input-$size.log" >&2; die "generated torch checkpoint is not a valid torch zip"; }
  elif [[ "$INPUT_FORMAT" == zero? ]]; then
    "$BIN" inspect "$dir" >"$WORK/logs/check-input-$size.log" 2>&1 ||
      { cat "$WORK/logs/check-input-$size.log" >&2; die "reshardctl inspect refused the generated ZeRO checkpoint"; }
  else
    "$PY" "$HERE/check_checkpoint.py" "$dir" >"$WORK/logs/check-input-$size.log" 2>&1 ||
      { cat "$WORK/logs/check-input-$size.log" >&2; die "generated checkpoint failed the format check"; }
  fi
  echo "checkpoint: $size -> $(echo "$summary" | "$PY" -c 'import json, sys
d = json.load(sys.stdin)
line = "%(total_size)d data bytes, %(files)d files, %(tensors)d tensors" % d
if "stage" in d:
    line += ", DeepSpeed ZeRO-%(stage)d over %(ranks)d ranks, %(bytes_on_disk)d bytes on disk" % d
else:
    line += (", hidden %(hidden_size)d, intermediate %(intermediate_size)d, layers "
             "%(num_hidden_layers)d, vocab %(vocab_size)d" % d)
print(line)'); generated in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s"
}

# ---------------------------------------------------------------- one measurement
# measure LABEL OUT_DIR IN_DIR VERIFY(0|1) SCRIPT [ARGS...]
# Runs `bash -c SCRIPT _ ARGS...` under /usr/bin/time -v REPEAT times with the cache prepared
# before each run, and sets R_WALL (best), R_RSS_KB (max over runs), R_CPU (user+sys of the
# best run), R_OUT_BYTES (size of OUT_DIR). OUT_DIR is removed after each run, except the last
# one with --keep. With VERIFY=1, `reshardctl verify IN OUT` must exit 0 after each run.
measure() {
  local label="$1" out="$2" in="$3" verify="$4" script="$5"
  shift 5
  R_WALL="" R_RSS_KB=0 R_CPU="" R_OUT_BYTES=0
  local i tf log rc wall rss cpu
  for ((i = 1; i <= REPEAT; i++)); do
    rm_out "$out"
    add_big "$out"
    prepare_cache
    tf="$WORK/logs/$label.$i.time"
    log="$WORK/logs/$label.$i.log"
    note "run $label ($i/$REPEAT)"
    set +e
    "$TIME" -v -o "$tf" bash -c "$script" _ "$@" >"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
      tail -n 20 "$log" >&2
      die "$label exited with status $rc (log: $log)"
    fi
    wall="$(awk -F': ' '/Elapsed \(wall clock\) time/ {
              n = split($NF, p, ":"); s = 0; for (k = 1; k <= n; k++) s = s * 60 + p[k]; print s }' "$tf")"
    rss="$(awk -F': ' '/Maximum resident set size/ {print $NF}' "$tf")"
    cpu="$(awk -F': ' '/User time \(seconds\)/ {u = $NF} /System time \(seconds\)/ {s = $NF}
              END {printf "%.2f", u + s}' "$tf")"
    if [ -z "$wall" ] || [ -z "$rss" ]; then die "could not parse $tf"; fi
    if [ -z "$R_WALL" ] || awk -v a="$wall" -v b="$R_WALL" 'BEGIN {exit !(a < b)}'; then
      R_WALL="$wall" R_CPU="$cpu"
    fi
    ((rss > R_RSS_KB)) && R_RSS_KB=$rss
    R_OUT_BYTES="$(dir_bytes "$out")"
    if ((verify)); then
      note "verify $label ($i/$REPEAT)"
      set +e
      "$BIN" verify "$in" "$out" >"$WORK/logs/$label.$i.verify.log" 2>&1
      rc=$?
      set -e
      if ((rc != 0)); then
        tail -n 20 "$WORK/logs/$label.$i.verify.log" >&2
        die "reshardctl verify $in $out exited with $rc after $label (log: $WORK/logs/$label.$i.verify.log)"
      fi
      if compgen -G "$out/*.safetensors" >/dev/null; then
        "$PY" "$HERE/check_checkpoint.py" "$out" >"$WORK/logs/$label.$i.check.log" 2>&1 ||
          { cat "$WORK/logs/$label.$i.check.log" >&2; die "output of $label failed the independent format check"; }
      else  # torch output: real torch must load it (weights_only: only tensors in a flat dict)
        "$PY" -c 'import glob, os, sys, torch, zipfile
n = 0
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.bin"))):
    assert zipfile.ZipFile(f).testzip() is None, "bad CRC in " + f
    sd = torch.load(f, map_location="cpu", weights_only=True)
    n += len(sd)
    del sd
print("%d tensors loaded" % n)' "$out" >"$WORK/logs/$label.$i.check.log" 2>&1 ||
          { cat "$WORK/logs/$label.$i.check.log" >&2; die "output of $label failed torch.load"; }
      fi
    fi
    # --keep keeps the last run's output; otherwise free the space before the next run.
    if ((!KEEP || i < REPEAT)); then rm_out "$out"; fi
  done
}

# Both run through `bash -c SCRIPT _ ARGS...`; the quoting is meant for that inner bash.
# shellcheck disable=SC2016
CP_SCRIPT='cp -r -- "$1" "$2" && sync'
# shellcheck disable=SC2016
CONS_SCRIPT='bin="$1" in="$2" out="$3"; shift 3; "$bin" consolidate "$in" "$out" "$@" --no-progress && sync'

ROWS=()   # "label|wall|mbps|rss_mib|ratio|cpu|out_mib"
fmt_row() {  # LABEL INPUT_BYTES BASE_WALL(or empty)
  awk -v l="$1" -v b="$2" -v w="$R_WALL" -v r="$R_RSS_KB" -v base="$3" -v c="$R_CPU" -v o="$R_OUT_BYTES" 'BEGIN {
    ratio = (base == "" || base == 0) ? "-" : sprintf("%.2fx", w / base)
    mbps = (w > 0) ? sprintf("%.0f", b / w / 1e6) : "inf"
    printf "%s|%.2f|%s|%.1f|%s|%.2f|%.1f\n", l, w, mbps, r / 1024, ratio, c, o / 1048576 }'
}
print_table() {  # HEADER ROWS...
  local header="$1"
  shift
  { echo "$header"; printf '%s\n' "$@"; } | awk -F'|' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NF; rows = NR }
    END { for (r = 1; r <= rows; r++) {
            line = ""
            for (i = 1; i <= n; i++) line = line sprintf(i == 1 ? "%-*s" : "  %*s", w[i], cell[r, i])
            print line
            if (r == 1) { s = ""; for (i = 1; i <= length(line); i++) s = s "-"; print s } } }'
}

# ---------------------------------------------------------------- main table
IN="$(input_path "$SIZE_ARG")"
make_checkpoint "$SIZE_ARG" "$IN"
IN_BYTES="$(dir_bytes "$IN")"
warm_input "$IN"
echo "input:      $IN_BYTES bytes on disk ($((IN_BYTES >> 20)) MiB)"

BASE_WALL=""
MAIN_FP32_ROW=""
if has_step cp; then
  measure "cp-sync" "$WORK/copy" "$IN" 0 "$CP_SCRIPT" "$IN" "$WORK/copy"
  BASE_WALL="$R_WALL"
  ROWS+=("$(fmt_row "cp -r + sync" "$IN_BYTES" "$BASE_WALL")")
fi
if has_step fp32; then
  measure "consolidate-fp32" "$WORK/out-fp32" "$IN" "$VERIFY" "$CONS_SCRIPT" "$BIN" "$IN" "$WORK/out-fp32" "${EXTRA[@]}"
  ROWS+=("$(fmt_row "consolidate fp32 + sync" "$IN_BYTES" "$BASE_WALL")")
  MAIN_FP32_ROW="$(fmt_row "$SIZE_ARG" "$IN_BYTES" "")"
fi
if has_step bf16; then
  measure "consolidate-bf16" "$WORK/out-bf16" "$IN" "$VERIFY" "$CONS_SCRIPT" "$BIN" "$IN" "$WORK/out-bf16" --dtype bf16 "${EXTRA[@]}"
  ROWS+=("$(fmt_row "consolidate bf16 + sync" "$IN_BYTES" "$BASE_WALL")")
fi
if has_step torch; then
  measure "consolidate-torch" "$WORK/out-torch" "$IN" "$VERIFY" "$CONS_SCRIPT" "$BIN" "$IN" "$WORK/out-torch" --format torch "${EXTRA[@]}"
  ROWS+=("$(fmt_row "consolidate --format torch + sync" "$IN_BYTES" "$BASE_WALL")")
fi

if has_step universal; then
  measure "consolidate-universal" "$WORK/out-universal" "$IN" 0 "$CONS_SCRIPT" "$BIN" "$IN" "$WORK/out-universal" --format deepspeed-universal "${EXTRA[@]}"
  ROWS+=("$(fmt_row "consolidate --format deepspeed-universal + sync" "$IN_BYTES" "$BASE_WALL")")
fi

{
  echo
  echo "== results: $SIZE_ARG F32 $INPUT_FORMAT checkpoint, $IN_BYTES input bytes, page cache $CACHE_MODE, best of $REPEAT$( ((VERIFY)) && echo ", verified")"
  print_table "step|wall s|MB/s|peak RSS MiB|vs cp+sync|cpu s|out MiB" "${ROWS[@]}"
} | tee "$WORK/results.txt"

# ---------------------------------------------------------------- memory vs model size
if ((${#SIZES[@]})); then
  if ((!KEEP)); then rm -rf -- "$IN"; fi
  SROWS=()
  for idx in "${!SIZES[@]}"; do
    s="${SIZES[$idx]}"
    if [ "${SIZES_BYTES[$idx]}" = "$SIZE_BYTES" ] && [ -n "$MAIN_FP32_ROW" ]; then
      SROWS+=("$(echo "$MAIN_FP32_ROW" | awk -F'|' -v b="$IN_BYTES" -v l="$s" 'BEGIN {OFS = "|"} {$1 = l; print $1, int(b / 1048576), $2, $3, $4, $6}')")
      continue
    fi
    SIN="$(input_path "$s")"
    echo
    make_checkpoint "$s" "$SIN"
    SIN_BYTES="$(dir_bytes "$SIN")"
    warm_input "$SIN"
    measure "consolidate-fp32-$s" "$WORK/out-fp32-$s" "$SIN" "$VERIFY" "$CONS_SCRIPT" "$BIN" "$SIN" "$WORK/out-fp32-$s" "${EXTRA[@]}"
    SROWS+=("$(fmt_row "$s" "$SIN_BYTES" "" | awk -F'|' -v b="$SIN_BYTES" 'BEGIN {OFS = "|"} {print $1, int(b / 1048576), $2, $3, $4, $6}')")
    if ((!KEEP)); then rm -rf -- "$SIN"; fi
  done
  {
    echo
    echo "== peak RSS of consolidate (fp32, default settings) vs model size, page cache $CACHE_MODE"
    print_table "size|input MiB|wall s|MB/s|peak RSS MiB|cpu s" "${SROWS[@]}"
  } | tee -a "$WORK/results.txt"
fi
echo
echo "results saved to $WORK/results.txt"
