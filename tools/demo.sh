#!/usr/bin/env bash
# The main job (README): builds reshardd and reshardctl, makes a small sharded Llama-like
# checkpoint, starts reshardd on a loopback port with a state folder in the work folder, and
# through `reshardctl --server` consolidates the checkpoint to bf16 Hugging Face shards, splits
# it into tensor-parallel parts and merges them back, verifying every result element by element
# (reshard's verify, then numpy and real PyTorch), consolidates a DeepSpeed ZeRO-3 checkpoint
# saved by 4 ranks straight from its save folder (checked against the original tensors with
# PyTorch), shows the daemon's metrics, and stops the daemon cleanly with SIGTERM.
#   tools/demo.sh [WORKDIR]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools/setup.sh demo
bazel build //client:reshardctl //server:reshardd
ctl="$root/bazel-bin/client/reshardctl"
daemon="$root/bazel-bin/server/reshardd"

work="${1:-$(mktemp -d /tmp/reshard-demo.XXXXXX)}"
mkdir -p "$work"
rm -rf "$work/checkpoint" "$work/consolidated-bf16" "$work/tp4" "$work/merged" "$work/state" \
  "$work/zero-run" "$work/zero-consolidated"
step() { printf '\n== %s\n' "$*"; }

daemon_pid=""
stop_daemon() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    wait "$daemon_pid" || true
  fi
}
trap stop_daemon EXIT

step "making a 96 MiB sharded fp32 checkpoint in $work/checkpoint"
/usr/bin/python3 tools/bench/make_checkpoint.py "$work/checkpoint" --size 96MiB \
  --max-shard-size 30MB --quiet
ls -l "$work/checkpoint"

step "starting reshardd (state in $work/state, allowed root $work)"
"$daemon" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --state-dir "$work/state" \
  --allowed-root "$work" --memory-budget 2GiB --max-concurrent-jobs 2 > "$work/reshardd.out" \
  2> "$work/reshardd.log" &
daemon_pid=$!
for _ in $(seq 100); do
  grep -q '^metrics on ' "$work/reshardd.out" 2>/dev/null && break
  sleep 0.1
done
cat "$work/reshardd.out"
export RESHARD_SERVER="$(sed -n 's/^listening on //p' "$work/reshardd.out")"
metrics="$(sed -n 's/^metrics on //p' "$work/reshardd.out")"
[ -n "$RESHARD_SERVER" ] || { echo "reshardd did not start:"; cat "$work/reshardd.log"; exit 1; }

step "reshardctl inspect (through reshardd at $RESHARD_SERVER)"
"$ctl" inspect "$work/checkpoint" > "$work/inspect.txt"
head -n 12 "$work/inspect.txt"
echo "  ... ($(wc -l < "$work/inspect.txt") lines; --json for the full document)"

step "reshardctl plan (dry run): consolidate to bf16 in files of at most 20 MB"
"$ctl" plan "$work/checkpoint" --dtype bf16 --max-shard-size 20MB

step "reshardctl consolidate --dtype bf16 --max-shard-size 20MB"
"$ctl" consolidate "$work/checkpoint" "$work/consolidated-bf16" --dtype bf16 \
  --max-shard-size 20MB

step "reshardctl verify, in-process (bf16 must equal round-to-nearest-even of the fp32 originals)"
"$ctl" verify "$work/checkpoint" "$work/consolidated-bf16"

cat > "$work/llama-tp.json" <<'RULES'
{"rules": [
  {"pattern": "(q|k|v|gate|up)_proj\\.weight$", "split_dim": 0},
  {"pattern": "(o|down)_proj\\.weight$", "split_dim": 1},
  {"pattern": "(embed_tokens|lm_head)\\.weight$", "split_dim": 0},
  {"pattern": ".*", "replicate": true}
]}
RULES
step "reshardctl reshard into 4 tensor-parallel parts (rules: $work/llama-tp.json)"
"$ctl" reshard "$work/checkpoint" "$work/tp4" --parts 4 --rules "$work/llama-tp.json"

step "reshardctl consolidate the 4 parts back into one model"
"$ctl" consolidate "$work/tp4" "$work/merged" --rules "$work/llama-tp.json"

step "reshardctl verify merged == original (bit-exact)"
"$ctl" verify "$work/checkpoint" "$work/merged"

step "a DeepSpeed ZeRO-3 run saved by 4 ranks (latest -> global_step1000/, as DeepSpeed lays it out)"
/usr/bin/python3 tools/bench/make_zero_checkpoint.py "$work/zero-run" --size 32MiB --ranks 4 \
  --with-moments --quiet > /dev/null
ls "$work/zero-run/global_step1000" > "$work/zero-files.txt"
head -n 4 "$work/zero-files.txt"
echo "  ... ($(wc -l < "$work/zero-files.txt") files)"

step "reshardctl inspect the save folder: the layout is recognized from the files"
"$ctl" inspect "$work/zero-run" > "$work/zero-inspect.txt"
head -n 4 "$work/zero-inspect.txt"

step "reshardctl consolidate the ZeRO-3 save folder to Hugging Face safetensors (fp32 master weights)"
"$ctl" consolidate "$work/zero-run" "$work/zero-consolidated" --max-shard-size 10MB --no-progress
ls "$work/zero-consolidated"

step "independent check with real PyTorch: every parameter equals the one the ranks partitioned"
/usr/bin/python3 - "$work/zero-consolidated" <<'PY'
import sys
sys.path.insert(0, "tests")
sys.path.insert(0, "tests/fixtures")
import numpy as np
import torch
import st_reference as st
import zero_fixture
model = zero_fixture.synthetic_model(32 << 20, with_moments=True)  # same seed as the checkpoint
expected = {}
for group in model.groups:
    expected.update(group)
out = st.read_folder(sys.argv[1])
for name, tensor in expected.items():
    got = torch.from_numpy(np.ascontiguousarray(out[name].array))
    assert torch.equal(got, tensor), f"{name} differs"
print(f"torch {torch.__version__}: {len(expected)} parameters equal the originals exactly")
PY

step "reshardctl list: the daemon's jobs"
"$ctl" list

step "reshardd metrics (http://$metrics/metrics)"
/usr/bin/python3 - "$metrics" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith(("reshard_jobs_finished_total", "reshard_written_bytes_total",
                        "reshard_job_duration_seconds_count", "reshard_memory_budget_bytes")):
        if not line.rstrip().endswith(" 0"):
            print("  " + line)
PY

step "independent check with numpy and real PyTorch: every tensor of the bf16 output"
/usr/bin/python3 - "$work/checkpoint" "$work/consolidated-bf16" <<'PY'
import sys
sys.path.insert(0, "tests")
import numpy as np
import torch
import st_reference as st
src = st.read_folder(sys.argv[1])
out = st.read_folder(sys.argv[2])
assert list(src) and set(src) == set(out), "tensor names differ"
for name, tensor in src.items():
    converted = out[name]
    assert converted.dtype == "BF16", (name, converted.dtype)
    got = np.ascontiguousarray(converted.array).view(np.uint16)
    assert np.array_equal(st.bf16_rne(tensor.array), got), f"{name}: differs from numpy RNE"
    want = torch.from_numpy(np.ascontiguousarray(tensor.array)).to(torch.bfloat16)
    assert torch.equal(want.view(torch.int16), torch.from_numpy(got.view(np.int16))), name
print(f"numpy and torch {torch.__version__} agree: {len(src)} tensors rounded to bf16 exactly")
PY

step "stopping reshardd with SIGTERM"
stop_daemon
tail -n 2 "$work/reshardd.log"

echo
echo "demo done: outputs in $work"
