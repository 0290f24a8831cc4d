#!/usr/bin/env bash
# Benchmark of reshardctl conversions against a plain `cp -r && sync` of the same checkpoint,
# run in alternating pairs (cp, X, cp, X, ...). See tools/bench/README.md. Usage:
#
#   tools/bench/bench.sh [--size 4GiB] [--sizes 1GiB,4GiB [--table-sizes]] [--pairs N]
#                        [--workdir DIR] [--keep] [--verify] [--no-drop-caches]
#                        [--steps fp32,bf16,torch,olmo,universal,split,dcp,dcp-split] [--split-parts M]
#                        [--input-format safetensors|torch|metaseq|zero1|zero2|zero3|dcp|torch-dist|olmo|colossalai]
#                        [--zero-ranks N] [--zero-moments]
#                        [--reshardctl PATH]
#                        [-- EXTRA_ARGS...]
#
# EXTRA_ARGS (after --) are appended to every reshardctl conversion, e.g. -- --threads 2.
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
  --table-sizes      run the whole main table at each size of --sizes instead (one checkpoint
                     at a time; --size is then ignored), e.g. --sizes 2GiB,16GiB --table-sizes
  --pairs N          for each step X run `cp -r + sync` and X alternately N times (cp, X, cp, X,
                     ...) and report medians (default 5)
  --repeat N         deprecated alias of --pairs
  --workdir DIR      where checkpoints and outputs go (default: a new folder under /tmp)
  --keep             keep the checkpoints and outputs (default: delete every big file at the end)
  --verify           after the first run of each conversion, `reshardctl verify IN OUT` (must
                     exit 0) and an independent format check of OUT (not timed)
  --steps LIST       conversions to measure, each paired with its own cp runs:
                       fp32       consolidate
                       bf16       consolidate --dtype bf16
                       torch      consolidate --format torch (pytorch_model.bin)
                       olmo       consolidate --format olmo-safetensors (OLMo's key encoding)
                       universal  consolidate --format deepspeed-universal (zero inputs with
                                  --zero-moments; reads every byte of the checkpoint, like cp -r)
                       split      reshard --parts M (--split-parts, default 4): safetensors and
                                  torch inputs 1 -> M with Llama rules (strided boxes),
                                  metaseq 2 -> M with --rules metaseq --format torch
                       dcp        consolidate --format torch-dcp (one chunk per tensor)
                       dcp-split  reshard --parts M --format torch-dcp (M ranks' .distcp
                                  files, the split step's rules)
                     default: fp32,bf16,split (safetensors), fp32,bf16,torch,split (torch,
                     metaseq), fp32,bf16,torch (zero1/2/3), fp32,bf16,torch,olmo (olmo),
                     fp32,bf16,torch,split (colossalai). `cp` is accepted and ignored.
  --split-parts M    output parts of the split step (default 4)
  --input-format F   safetensors (default: HF sharded folder from make_checkpoint.py),
                     torch (one torch.save file from make_torch_checkpoint.py; needs
                     python3-torch and about the checkpoint size in RAM to generate),
                     metaseq (2 model-parallel parts reshard-model_part-<i>.pt from
                     make_metaseq_checkpoint.py; about SIZE / 2 in RAM to generate) or
                     zero3 (a DeepSpeed ZeRO-3 save folder from make_zero_checkpoint.py:
                     SIZE bytes of fp32 parameters partitioned over --zero-ranks ranks, no
                     Adam moments, so `cp -r` copies the same bytes reshard reads)
                     zero1, zero2: the same with ZeRO-1/2's flat partitions
                     dcp (a PyTorch DCP folder of 4 ranks: the safetensors checkpoint of
                     make_checkpoint.py resharded by reshardctl with the Llama rules)
                     torch-dist (a Megatron-Core torch_dist save folder, TP 2, 24 layers
                     stacked, from make_torch_dist_checkpoint.py; streamed, little RAM)
                     olmo: one OLMo safetensors file (model.safetensors, keys as OLMo's
                     safetensors_util encodes them), made by reshardctl from a
                     make_checkpoint.py checkpoint
                     colossalai: a ColossalAI distributed checkpoint (PR #6181) of 4
                     tensor-parallel ranks, safetensors weights + metadata, from
                     make_colossalai_checkpoint.py (numpy only)
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
TABLE_SIZES=0
PAIRS=5
WORK=""
KEEP=0
VERIFY=0
STEPS=""
SPLIT_PARTS=4
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
    --table-sizes) TABLE_SIZES=1; shift ;;
    --pairs) PAIRS="${2:?--pairs needs a value}"; shift 2 ;;
    --pairs=*) PAIRS="${1#*=}"; shift ;;
    --repeat) note "--repeat is deprecated: it is --pairs now (alternating cp / conversion pairs, medians)"
              PAIRS="${2:?--repeat needs a value}"; shift 2 ;;
    --repeat=*) note "--repeat is deprecated: it is --pairs now (alternating cp / conversion pairs, medians)"
                PAIRS="${1#*=}"; shift ;;
    --workdir) WORK="${2:?--workdir needs a value}"; shift 2 ;;
    --workdir=*) WORK="${1#*=}"; shift ;;
    --keep) KEEP=1; shift ;;
    --verify) VERIFY=1; shift ;;
    --no-drop-caches) DROP=0; shift ;;
    --steps) STEPS="${2:?--steps needs a value}"; shift 2 ;;
    --steps=*) STEPS="${1#*=}"; shift ;;
    --split-parts) SPLIT_PARTS="${2:?--split-parts needs a value}"; shift 2 ;;
    --split-parts=*) SPLIT_PARTS="${1#*=}"; shift ;;
    --input-format) INPUT_FORMAT="${2:?--input-format needs a value}"; shift 2 ;;
    --input-format=*) INPUT_FORMAT="${1#*=}"; shift ;;
    --zero-ranks) ZERO_RANKS="${2:?--zero-ranks needs a value}"; shift 2 ;;
    --zero-ranks=*) ZERO_RANKS="${1#*=}"; shift ;;
    --zero-moments) ZERO_MOMENTS=1; shift ;;
    --reshardctl) BIN_ARG="${2:?--reshardctl needs a value}"; shift 2 ;;
    --reshardctl=*) BIN_ARG="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$PAIRS" =~ ^[1-9][0-9]*$ ]] || die "--pairs must be a positive integer"
[[ "$SPLIT_PARTS" =~ ^[1-9][0-9]*$ ]] || die "--split-parts must be a positive integer"
case "$INPUT_FORMAT" in
  safetensors) STEPS="${STEPS:-fp32,bf16,split}" ;;
  torch|metaseq) STEPS="${STEPS:-fp32,bf16,torch,split}" ;;
  zero1|zero2|zero3) STEPS="${STEPS:-fp32,bf16,torch}" ;;
  dcp) STEPS="${STEPS:-fp32,bf16,dcp,dcp-split}" ;;
  torch-dist) STEPS="${STEPS:-fp32,bf16,dcp}" ;;
  olmo) STEPS="${STEPS:-fp32,bf16,torch,olmo}" ;;
  colossalai) STEPS="${STEPS:-fp32,bf16,torch,split}" ;;
  *) die "--input-format: unknown format '$INPUT_FORMAT' (use safetensors, torch, metaseq, zero1, zero2, zero3, dcp, torch-dist, olmo or colossalai)" ;;
esac
STEP_LIST=()
for s in ${STEPS//,/ }; do
  case "$s" in
    cp) ;;  # every step is paired with its own cp runs
    fp32|bf16|torch|olmo|universal|split|dcp|dcp-split) [[ " ${STEP_LIST[*]} " == *" $s "* ]] || STEP_LIST+=("$s") ;;
    *) die "--steps: unknown step '$s' (use fp32,bf16,torch,olmo,universal,split,dcp,dcp-split)" ;;
  esac
done
((${#STEP_LIST[@]})) || die "--steps: no conversion step (cp alone is not measured: it is every step's baseline)"
if [[ " ${STEP_LIST[*]} " == *" split "* || " ${STEP_LIST[*]} " == *" dcp-split "* ]] &&
  [[ "$INPUT_FORMAT" == zero? ]]; then
  die "--steps split, dcp-split: not for ZeRO inputs (use safetensors, torch, metaseq or dcp)"
fi
if [[ " ${STEP_LIST[*]} " == *" dcp-split "* && "$INPUT_FORMAT" == metaseq ]]; then
  die "--steps dcp-split: not for metaseq (its fused qkv_proj split is not one box per rank)"
fi
if [[ " ${STEP_LIST[*]} " == *"split "* && "$INPUT_FORMAT" == torch-dist ]]; then
  die "--steps split, dcp-split: not for torch-dist (the Llama rules do not name its tensors)"
fi
if ((TABLE_SIZES)) && [ -z "$SIZES_ARG" ]; then die "--table-sizes needs --sizes S1,S2,..."; fi

[ -x "$TIME" ] || die "$TIME not found (GNU time; run tools/setup.sh or apt-get install time)"
[ -x "$PY" ] || die "$PY not found (run tools/setup.sh)"
"$PY" -c 'import numpy' 2>/dev/null || die "numpy missing for $PY (apt-get install python3-numpy)"
[[ "$ZERO_RANKS" =~ ^[1-9][0-9]*$ ]] || die "--zero-ranks must be a positive integer"
if [[ "$INPUT_FORMAT" != safetensors && "$INPUT_FORMAT" != olmo && "$INPUT_FORMAT" != colossalai ]]; then
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
# The sizes of the main table: --size, or with --table-sizes every size of --sizes.
if ((TABLE_SIZES)); then
  TABLE=("${SIZES[@]}")
else
  TABLE=("$SIZE_ARG")
fi
MAX_BYTES="$SIZE_BYTES"
SUM_BYTES=0
for b in "${SIZES_BYTES[@]}"; do ((b > MAX_BYTES)) && MAX_BYTES=$b; done
if ((TABLE_SIZES)); then
  MAX_BYTES=0
  for b in "${SIZES_BYTES[@]}"; do ((b > MAX_BYTES)) && MAX_BYTES=$b; SUM_BYTES=$((SUM_BYTES + b)); done
else
  SUM_BYTES=$SIZE_BYTES
  for b in "${SIZES_BYTES[@]}"; do ((b != SIZE_BYTES)) && SUM_BYTES=$((SUM_BYTES + b)); done
fi

# ---------------------------------------------------------------- workdir, free space, cleanup
# Free space first (on the folder or its nearest existing parent), so a failed check leaves nothing.
probe="${WORK:-/tmp}"
while [ ! -d "$probe" ]; do probe="$(dirname "$probe")"; done
AVAIL="$(df -P -B1 "$probe" | awk 'NR==2 {print $4}')"
# Input bytes on disk per byte of SIZE, in tenths: ZeRO-1/2 folders also hold the 16-bit weights
# (1.5x), --zero-moments adds two moments of SIZE each.
IN_X10=10
[[ "$INPUT_FORMAT" == zero[12] ]] && IN_X10=15
((ZERO_MOMENTS)) && [[ "$INPUT_FORMAT" == zero? ]] && IN_X10=$((IN_X10 + 20))
# One checkpoint at a time: input + its copy or one output (the universal output is as big as
# the input), with SIZE to spare. --keep leaves every checkpoint, the copy and every output.
NEED=$(((2 * IN_X10 + 10) * MAX_BYTES / 10))
((KEEP)) && NEED=$(((2 * IN_X10 + 40) * SUM_BYTES / 10))
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
RUNS="$WORK/logs/runs.tsv"
printf 'label\tpair\twall_s\tuser_s\tsys_s\trss_kib\tcached_before_kib\tcached_after_kib\tsize\tinput_format\tdisk_read_blocks\n' >"$RUNS"
: >"$WORK/results.txt"

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

# Partition rules of the split step for the Llama-like inputs (make_checkpoint.py and
# make_torch_checkpoint.py names): column-parallel q/k/v/gate/up by rows, row-parallel o/down
# by columns, embed_tokens and lm_head by the hidden dimension (the generated vocabulary need
# not divide by M), norms replicated. Every part then reads strided boxes of most tensors.
LLAMA_RULES="$WORK/llama-rules.json"
cat >"$LLAMA_RULES" <<'EOF'
{"rules": [
  {"pattern": "(q|k|v|gate|up)_proj\\.weight$", "split_dim": 0},
  {"pattern": "(o|down)_proj\\.weight$", "split_dim": 1},
  {"pattern": "(embed_tokens|lm_head)\\.weight$", "split_dim": 1},
  {"pattern": ".*", "replicate": true}
]}
EOF
# metaseq parts are merged with the metaseq preset by every command, the rest need no rules.
IN_RULES=()
[ "$INPUT_FORMAT" = metaseq ] && IN_RULES=(--rules metaseq)

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
{
  echo "== reshard benchmark"
  echo "date:       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git:        $(git_rev)"
  echo "binary:     $SRC_BIN"
  echo "machine:    nproc=$(nproc), memory=$((MEM_KB / 1024)) MiB, cpu=${CPU_MODEL:-?}, kernel=$(uname -r)"
  echo "workdir:    $WORK, filesystem $FS, $((AVAIL >> 30)) GiB free"
  echo "pairs:      $PAIRS per step (cp -r + sync, then the step, alternately; medians reported)"
  echo "steps:      ${STEP_LIST[*]} on ${TABLE[*]} $INPUT_FORMAT input"
  if ((${#EXTRA[@]})); then echo "extra args: ${EXTRA[*]}"; fi
} | tee -a "$WORK/results.txt"

# ---------------------------------------------------------------- page cache
CACHE_MODE=""
drop_caches() {  # returns 0 if the page cache was dropped
  sync
  ((DROP)) && { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null
}
if drop_caches; then
  CACHE_MODE="cold"
  echo "page cache: dropped before every measured run (cold reads)" | tee -a "$WORK/results.txt"
else
  CACHE_MODE="warm"
  if ((DROP)); then why="/proc/sys/vm/drop_caches not writable"; else why="--no-drop-caches"; fi
  {
    echo "page cache: NOT dropped ($why); input is read once"
    echo "            before the first run so every run sees it cached (warm reads)"
  } | tee -a "$WORK/results.txt"
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
cached_kib() { awk '/^Cached:/ {print $2}' /proc/meminfo; }

# ---------------------------------------------------------------- checkpoint
dir_bytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'; }

# The input path for a size: a folder (safetensors shards, metaseq parts, a ZeRO save folder),
# or one torch.save file.
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
  elif [ "$INPUT_FORMAT" = metaseq ]; then
    summary="$("$PY" "$HERE/make_metaseq_checkpoint.py" --quiet --size "$size" --parts 2 "$dir")" ||
      die "make_metaseq_checkpoint.py failed"
  elif [[ "$INPUT_FORMAT" == zero? ]]; then
    local moments=()
    ((ZERO_MOMENTS)) && moments=(--with-moments)
    summary="$("$PY" "$HERE/make_zero_checkpoint.py" --quiet --size "$size" --ranks "$ZERO_RANKS" \
      --stage "${INPUT_FORMAT#zero}" "${moments[@]}" "$dir")" ||
      die "make_zero_checkpoint.py failed"
  elif [ "$INPUT_FORMAT" = torch-dist ]; then
    summary="$("$PY" "$HERE/make_torch_dist_checkpoint.py" --quiet --size "$size" "$dir")" ||
      die "make_torch_dist_checkpoint.py failed"
  elif [ "$INPUT_FORMAT" = dcp ]; then
    # The safetensors checkpoint, resharded into 4 ranks' DCP files by reshardctl itself.
    add_big "$dir.st"
    summary="$("$PY" "$HERE/make_checkpoint.py" --quiet --size "$size" "$dir.st")" ||
      die "make_checkpoint.py failed"
    "$BIN" reshard "$dir.st" "$dir" --parts 4 --rules "$LLAMA_RULES" --format torch-dcp \
      --no-progress >"$WORK/logs/make-dcp-$size.log" 2>&1 ||
      { cat "$WORK/logs/make-dcp-$size.log" >&2; die "reshardctl could not write the DCP input"; }
    rm -rf -- "$dir.st"
  elif [ "$INPUT_FORMAT" = colossalai ]; then
    summary="$("$PY" "$HERE/make_colossalai_checkpoint.py" --quiet --size "$size" --tp 4 "$dir")" ||
      die "make_colossalai_checkpoint.py failed"
  elif [ "$INPUT_FORMAT" = olmo ]; then
    # A Hugging Face checkpoint turned into OLMo's encoding by reshard itself (tested against
    # OLMo's own reader in tests/olmo_e2e_test.py); the source is deleted at once.
    add_big "$dir.src"
    summary="$("$PY" "$HERE/make_checkpoint.py" --quiet --size "$size" "$dir.src")" ||
      die "make_checkpoint.py failed"
    "$BIN" consolidate "$dir.src" "$dir" --format olmo-safetensors --no-progress \
      >"$WORK/logs/make-olmo-$size.log" 2>&1 ||
      { cat "$WORK/logs/make-olmo-$size.log" >&2; die "reshardctl could not write the OLMo input"; }
    rm -rf -- "$dir.src"
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
  elif [[ "$INPUT_FORMAT" == zero? || "$INPUT_FORMAT" == metaseq || "$INPUT_FORMAT" == dcp ||
          "$INPUT_FORMAT" == torch-dist || "$INPUT_FORMAT" == olmo || "$INPUT_FORMAT" == colossalai ]]; then
    "$BIN" inspect "$dir" "${IN_RULES[@]}" >"$WORK/logs/check-input-$size.log" 2>&1 ||
      { cat "$WORK/logs/check-input-$size.log" >&2; die "reshardctl inspect refused the generated $INPUT_FORMAT checkpoint"; }
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
    if "parts" in d:
        line += " per part, metaseq %(parts)d parts, %(bytes_on_disk)d bytes on disk" % d
    if "tp" in d:
        line += ", ColossalAI TP %(tp)d, %(bytes_on_disk)d bytes on disk" % d
    line += (", hidden %(hidden_size)d, intermediate %(intermediate_size)d, layers "
             "%(num_hidden_layers)d, vocab %(vocab_size)d" % d)
print(line)'); generated in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s" |
    tee -a "$WORK/results.txt"
}

# ---------------------------------------------------------------- steps
# step_setup STEP IN OUT: sets STEP_LABEL (file names, runs.tsv), STEP_TITLE (table), STEP_CMD
# (reshardctl arguments after the binary), STEP_PLAN (`reshardctl plan` arguments for the
# bytes the step reads), STEP_VERIFY (1: verify/check the output with --verify), STEP_RULES
# (rules for `reshardctl verify`) and STEP_PARTS (1: the output is model-parallel parts).
step_setup() {
  local step="$1" in="$2" out="$3"
  STEP_VERIFY=1 STEP_PARTS=0 STEP_RULES=("${IN_RULES[@]}")
  local opts=()
  case "$step" in
    fp32) STEP_LABEL=consolidate-fp32; STEP_TITLE="consolidate fp32" ;;
    bf16) STEP_LABEL=consolidate-bf16; STEP_TITLE="consolidate bf16"; opts=(--dtype bf16) ;;
    torch) STEP_LABEL=consolidate-torch; STEP_TITLE="consolidate --format torch"; opts=(--format torch) ;;
    olmo) STEP_LABEL=consolidate-olmo; STEP_TITLE="consolidate --format olmo-safetensors"
          opts=(--format olmo-safetensors) ;;
    universal) STEP_LABEL=consolidate-universal; STEP_TITLE="consolidate --format deepspeed-universal"
               opts=(--format deepspeed-universal); STEP_VERIFY=0 ;;
    dcp) STEP_LABEL=consolidate-dcp; STEP_TITLE="consolidate --format torch-dcp"; opts=(--format torch-dcp) ;;
    split|dcp-split)
      STEP_LABEL="reshard-split$SPLIT_PARTS" STEP_PARTS=1
      if [ "$step" = dcp-split ]; then
        STEP_LABEL="reshard-dcp-split$SPLIT_PARTS"
        STEP_TITLE="reshard -> $SPLIT_PARTS ranks (--format torch-dcp)"
        STEP_RULES=(--rules "$LLAMA_RULES")
        opts=(--parts "$SPLIT_PARTS" --format torch-dcp)
      elif [ "$INPUT_FORMAT" = metaseq ]; then
        STEP_TITLE="reshard 2 -> $SPLIT_PARTS parts (metaseq, torch)"
        opts=(--parts "$SPLIT_PARTS" --format torch)
      else
        STEP_TITLE="reshard 1 -> $SPLIT_PARTS parts"
        STEP_RULES=(--rules "$LLAMA_RULES")
        opts=(--parts "$SPLIT_PARTS")
      fi
      opts+=("${STEP_RULES[@]}")
      STEP_CMD=(reshard "$in" "$out" "${opts[@]}" "${EXTRA[@]}")
      STEP_PLAN=(plan "$in" "${opts[@]}")
      return 0 ;;
  esac
  opts+=("${IN_RULES[@]}")
  STEP_CMD=(consolidate "$in" "$out" "${opts[@]}" "${EXTRA[@]}")
  STEP_PLAN=(plan "$in" "${opts[@]}")
}

# ---------------------------------------------------------------- one run
# run_one LABEL PAIR SIZE OUT SCRIPT [ARGS...]
# Removes OUT, prepares the page cache, reads Cached: of /proc/meminfo, runs
# `bash -c SCRIPT _ ARGS...` under /usr/bin/time -v, reads Cached: again and appends the run to
# logs/runs.tsv.
run_one() {
  local label="$1" pair="$2" size="$3" out="$4" script="$5"
  shift 5
  local tf="$WORK/logs/$label.$size.$pair.time" log="$WORK/logs/$label.$size.$pair.log"
  local rc cb ca wall user sys rss disk
  rm_out "$out"
  add_big "$out"
  prepare_cache
  note "run $label at $size ($pair/$PAIRS)"
  cb="$(cached_kib)"
  set +e
  "$TIME" -v -o "$tf" bash -c "$script" _ "$@" >"$log" 2>&1
  rc=$?
  set -e
  ca="$(cached_kib)"
  if ((rc != 0)); then
    tail -n 20 "$log" >&2
    die "$label exited with status $rc (log: $log)"
  fi
  wall="$(awk -F': ' '/Elapsed \(wall clock\) time/ {
            n = split($NF, p, ":"); s = 0; for (k = 1; k <= n; k++) s = s * 60 + p[k]; print s }' "$tf")"
  user="$(awk -F': ' '/User time \(seconds\)/ {print $NF}' "$tf")"
  sys="$(awk -F': ' '/System time \(seconds\)/ {print $NF}' "$tf")"
  rss="$(awk -F': ' '/Maximum resident set size/ {print $NF}' "$tf")"
  # 512-byte blocks the kernel read from the device for the run (buffered and direct reads;
  # page-cache hits not counted): shows a step that reads its input more than once.
  disk="$(awk -F': ' '/File system inputs/ {print $NF}' "$tf")"
  if [ -z "$wall" ] || [ -z "$user" ] || [ -z "$sys" ] || [ -z "$rss" ] || [ -z "$disk" ]; then
    die "could not parse $tf"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$pair" "$wall" "$user" "$sys" "$rss" \
    "$cb" "$ca" "$size" "$INPUT_FORMAT" "$disk" >>"$RUNS"
}

# check_output LABEL IN OUT PARTS RULES...: `reshardctl verify IN OUT` must exit 0, then an
# independent check of OUT: check_checkpoint.py for safetensors, real torch for .bin / .pt.
check_output() {
  local label="$1" in="$2" out="$3" parts="$4"
  shift 4
  local vlog="$WORK/logs/$label.verify.log" clog="$WORK/logs/$label.check.log" rc
  note "verify $label"
  set +e
  "$BIN" verify "$in" "$out" "$@" >"$vlog" 2>&1
  rc=$?
  set -e
  if ((rc != 0)); then
    tail -n 20 "$vlog" >&2
    die "reshardctl verify $in $out exited with $rc after $label (log: $vlog)"
  fi
  if [ -f "$out/.metadata" ]; then
    # DCP output: the strict .metadata unpickler and torch.load of every item of
    # tests/dcp_output_test.py, each tensor reassembled from its chunks (one at a time).
    "$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import dcp_output_test as T
n = sum(1 for _ in T.iter_dcp(sys.argv[2]))
print("%d entries loaded" % n)' "$ROOT/tests" "$out" >"$clog" 2>&1 ||
      { cat "$clog" >&2; die "output of $label failed the independent DCP check"; }
  elif [[ "$label" == consolidate-olmo* ]]; then
    # OLMo's encoding: every name decodes to (key tuple, value_is_pickled), as OLMo's
    # safetensors_util.decode_key does, and the header is a valid safetensors header.
    "$PY" -c 'import base64, json, pickle, struct, sys
with open(sys.argv[1] + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    size = f.seek(0, 2)
end = 0
for name, t in header.items():
    keys, pickled = pickle.loads(base64.urlsafe_b64decode(name))
    assert isinstance(keys, tuple) and isinstance(pickled, bool), name
    end = max(end, t["data_offsets"][1])
assert 8 + n + end == size, "data does not end at the end of the file"
print("%d OLMo entries" % len(header))' "$out" >"$clog" 2>&1 ||
      { cat "$clog" >&2; die "output of $label failed the OLMo format check"; }
  elif compgen -G "$out/*.safetensors" >/dev/null; then
    local flags=()
    ((parts)) && flags=(--parts)
    "$PY" "$HERE/check_checkpoint.py" "$out" "${flags[@]}" >"$clog" 2>&1 ||
      { cat "$clog" >&2; die "output of $label failed the independent format check"; }
  else
    # torch output: real torch must load it, with weights_only (only what torch.load allows)
    # except for metaseq, whose cfg holds Python floats that torch 1.13's weights_only
    # unpickler refuses whoever writes them (docs/formats.md, "torch.save zip").
    local weights_only=1
    [ "$INPUT_FORMAT" = metaseq ] && weights_only=0
    "$PY" -c 'import glob, os, sys, torch, zipfile
n = 0
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.bin")) + glob.glob(os.path.join(sys.argv[1], "*.pt")))
assert files, "no .bin or .pt file"
for f in files:
    assert zipfile.ZipFile(f).testzip() is None, "bad CRC in " + f
    sd = torch.load(f, map_location="cpu", weights_only=sys.argv[2] == "1")
    sd = sd.get("model", sd)
    n += sum(1 for v in sd.values() if isinstance(v, torch.Tensor))
    del sd
print("%d files, %d tensors loaded" % (len(files), n))' "$out" "$weights_only" >"$clog" 2>&1 ||
      { cat "$clog" >&2; die "output of $label failed torch.load"; }
  fi
}

# Both run through `bash -c SCRIPT _ ARGS...`; the quoting is meant for that inner bash. Both end
# with the data durable: cp by the sync, reshardctl by its own fsyncs (the sync keeps the two
# symmetric).
# shellcheck disable=SC2016
CP_SCRIPT='cp -r -- "$1" "$2" && sync'
# shellcheck disable=SC2016
CONV_SCRIPT='bin="$1"; shift; "$bin" "$@" --no-progress && sync'

# ---------------------------------------------------------------- statistics
# stats LABEL SIZE: one line "n|wall|user|sys|rss_max_kib|growth_kib" over LABEL's runs at SIZE
# in runs.tsv (medians, max RSS).
STATS_AWK='
function median(a, n,   i, j, t) {
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  if (n == 0) return 0
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'
stats() {
  awk -F'\t' -v l="$1" -v s="$2" "$STATS_AWK"'
    NR > 1 && $1 == l && $9 == s {
      n++; w[n] = $3; u[n] = $4; y[n] = $5; g[n] = $8 - $7; d[n] = $11; if ($6 > r) r = $6 }
    END { printf "%d|%.2f|%.2f|%.2f|%d|%d|%d\n", n, median(w, n), median(u, n), median(y, n), r, median(g, n), median(d, n) }' "$RUNS"
}
# ratios X_LABEL CP_LABEL SIZE: "median|min|max" of the pair-by-pair wall ratios X_i / cp_i.
ratios() {
  awk -F'\t' -v x="$1" -v c="$2" -v s="$3" "$STATS_AWK"'
    NR > 1 && $9 == s && $1 == x { xw[$2] = $3 }
    NR > 1 && $9 == s && $1 == c { cw[$2] = $3 }
    END {
      for (p in xw) if ((p in cw) && cw[p] > 0) { n++; q[n] = xw[p] / cw[p]; if (n == 1 || q[n] < lo) lo = q[n]; if (n == 1 || q[n] > hi) hi = q[n] }
      if (n == 0) { print "-|-|-"; exit }
      m = median(q, n); printf "%.2f|%.2f|%.2f\n", m, lo, hi }' "$RUNS"
}

# row TITLE STATS RATIOS READ_BYTES OUT_BYTES: a table row.
row() {
  awk -v t="$1" -v st="$2" -v ra="$3" -v b="$4" -v o="$5" 'BEGIN {
    split(st, a, "|"); split(ra, q, "|")
    ratio = (q[1] == "" || q[1] == "-") ? "-" : sprintf("%.2fx (%.2f-%.2f)", q[1], q[2], q[3])
    mbps = (a[2] > 0) ? sprintf("%.0f", b / a[2] / 1e6) : "inf"
    growth = a[6] / 1024
    pct = (b > 0) ? sprintf("%.0f%%", a[6] * 1024 * 100 / b) : "-"
    outm = (o == "") ? "-" : sprintf("%.1f", o / 1048576)
    printf "%s|%d|%.2f|%s|%.0f|%.0f|%s|%.2f|%.2f|%.1f|%.0f|%s|%s\n",
      t, a[1], a[2], ratio, b / 1048576, a[7] * 512 / 1048576, mbps, a[3], a[4], a[5] / 1024, growth, pct, outm }'
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
TABLE_HEADER="step|runs|wall s|vs cp (min-max)|read MiB|disk read MiB|MB/s|user s|sys s|peak RSS MiB|cache +MiB|cache/read|out MiB"

# plan_read_bytes ARGS...: the source bytes `reshardctl plan ARGS --json` says the step reads.
plan_read_bytes() {
  "$BIN" "$@" --json 2>/dev/null | "$PY" -c 'import json, sys; print(int(json.load(sys.stdin)["source_bytes_read"]))' 2>/dev/null
}

# ---------------------------------------------------------------- main table
# main_table SIZE_ARG: generates the checkpoint, measures every step in pairs, prints the table.
main_table() {
  local size="$1" in in_bytes step cp_label out out_bytes read_bytes st ra i rows=()
  in="$(input_path "$size")"
  echo | tee -a "$WORK/results.txt"
  make_checkpoint "$size" "$in"
  in_bytes="$(dir_bytes "$in")"
  warm_input "$in"
  echo "input:      $in ($in_bytes bytes on disk, $((in_bytes >> 20)) MiB)" | tee -a "$WORK/results.txt"

  for step in "${STEP_LIST[@]}"; do
    out="$WORK/out-$step"
    step_setup "$step" "$in" "$out"
    cp_label="cp-sync.$step"
    read_bytes="$(plan_read_bytes "${STEP_PLAN[@]}")" || read_bytes=""
    if [ -z "$read_bytes" ]; then
      note "reshardctl ${STEP_PLAN[*]} failed; the $step step's cache/read uses the input's bytes on disk"
      read_bytes="$in_bytes"
    fi
    out_bytes=""
    for ((i = 1; i <= PAIRS; i++)); do
      run_one "$cp_label" "$i" "$size" "$WORK/copy" "$CP_SCRIPT" "$in" "$WORK/copy"
      if ((!KEEP || i < PAIRS)); then rm_out "$WORK/copy"; fi
      run_one "$STEP_LABEL" "$i" "$size" "$out" "$CONV_SCRIPT" "$BIN" "${STEP_CMD[@]}"
      out_bytes="$(dir_bytes "$out")"
      if ((VERIFY && STEP_VERIFY && i == 1)); then
        check_output "$STEP_LABEL.$size" "$in" "$out" "$STEP_PARTS" "${STEP_RULES[@]}"
      fi
      # --keep keeps the last run's output; otherwise free the space before the next run.
      if ((!KEEP || i < PAIRS)); then rm_out "$out"; fi
    done
    st="$(stats "$STEP_LABEL" "$size")"
    ra="$(ratios "$STEP_LABEL" "$cp_label" "$size")"
    rows+=("$(row "$STEP_TITLE + sync" "$st" "$ra" "$read_bytes" "$out_bytes")")
    st="$(stats "$cp_label" "$size")"
    rows+=("$(row "  its cp -r + sync" "$st" "-" "$in_bytes" "$in_bytes")")
    if [ "$step" = fp32 ]; then
      MAIN_FP32_STATS="$(stats "$STEP_LABEL" "$size")" MAIN_FP32_BYTES="$in_bytes" MAIN_FP32_READ="$read_bytes"
    fi
  done

  {
    echo
    echo "== results: $size F32 $INPUT_FORMAT checkpoint, $in_bytes input bytes, page cache $CACHE_MODE," \
      "medians of $PAIRS pair$( ((PAIRS > 1)) && echo s) (cp, step, cp, step, ...)$( ((VERIFY)) && echo ", verified")"
    print_table "$TABLE_HEADER" "${rows[@]}"
    echo "  wall, user, sys, cache: medians over the runs; vs cp: median of the pair-by-pair ratios step_i / cp_i"
    echo "  (min-max); peak RSS: the largest over the runs; cache +MiB: growth of Cached: in /proc/meminfo"
    echo "  (system-wide) from just before the run (after the cache drop or, warm, the sync) to just after it"
    echo "  (its data synced); cache/read: that growth as a share of the input bytes the step reads (read MiB,"
    echo "  from reshardctl plan; cp: all of them); disk read MiB: median of what the kernel read from the"
    echo "  device during the run (GNU time's File system inputs; more than read MiB = bytes read twice)"
  } | tee -a "$WORK/results.txt"
  if ((!KEEP)); then rm -rf -- "$in"; fi
}

MAIN_FP32_STATS=""
MAIN_FP32_BYTES=""
MAIN_FP32_READ=""
for size in "${TABLE[@]}"; do
  main_table "$size"
done

# ---------------------------------------------------------------- memory vs model size
if ((${#SIZES[@]})) && ((!TABLE_SIZES)); then
  SROWS=()
  for idx in "${!SIZES[@]}"; do
    s="${SIZES[$idx]}"
    if [ "${SIZES_BYTES[$idx]}" = "$SIZE_BYTES" ] && [ -n "$MAIN_FP32_STATS" ]; then
      st="$MAIN_FP32_STATS" sin_bytes="$MAIN_FP32_BYTES" sread="$MAIN_FP32_READ"
    else
      SIN="$(input_path "$s")"
      echo | tee -a "$WORK/results.txt"
      make_checkpoint "$s" "$SIN"
      sin_bytes="$(dir_bytes "$SIN")"
      warm_input "$SIN"
      step_setup fp32 "$SIN" "$WORK/out-fp32-$s"
      sread="$(plan_read_bytes "${STEP_PLAN[@]}")" || sread="$sin_bytes"
      for ((i = 1; i <= PAIRS; i++)); do
        run_one "rss.$STEP_LABEL" "$i" "$s" "$WORK/out-fp32-$s" "$CONV_SCRIPT" "$BIN" "${STEP_CMD[@]}"
        if ((VERIFY && i == 1)); then
          check_output "rss.$STEP_LABEL.$s" "$SIN" "$WORK/out-fp32-$s" 0 "${STEP_RULES[@]}"
        fi
        if ((!KEEP || i < PAIRS)); then rm_out "$WORK/out-fp32-$s"; fi
      done
      st="$(stats "rss.$STEP_LABEL" "$s")"
      if ((!KEEP)); then rm -rf -- "$SIN"; fi
    fi
    SROWS+=("$(awk -v l="$s" -v b="$sin_bytes" -v r="$sread" -v st="$st" 'BEGIN {
      split(st, a, "|")
      printf "%s|%d|%d|%d|%.2f|%s|%.1f|%.2f\n", l, b / 1048576, r / 1048576, a[1], a[2],
        (a[2] > 0) ? sprintf("%.0f", r / a[2] / 1e6) : "inf", a[5] / 1024, a[3] + a[4] }')")
  done
  {
    echo
    echo "== peak RSS of consolidate (fp32, default settings) vs model size, page cache $CACHE_MODE"
    print_table "size|input MiB|read MiB|runs|wall s|MB/s|peak RSS MiB|cpu s" "${SROWS[@]}"
    echo "  $PAIRS runs of consolidate alone at each size; wall: median; MB/s: read MiB / wall;"
    echo "  peak RSS: the largest over the runs; cpu: median user + median sys"
  } | tee -a "$WORK/results.txt"
fi
echo
echo "results saved to $WORK/results.txt, every run in $RUNS"
