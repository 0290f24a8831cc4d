#!/bin/bash
# A partitioned conversion on a real Slurm (slurmctld + slurmd + munged on 127.0.0.1, started
# here with a configuration generated for this run): deploy/slurm/convert.sbatch as a 4-task
# array must publish an output equal, byte for byte, to a single-worker run; a task cancelled
# mid-way (scancel) leaves nothing published, and rerunning that index completes it, reusing
# the files the task had committed; `srun -n 2` inside each task of a 2-task array makes four
# partitions.
#
# Flags (tests/e2e.bzl): --reshardctl PATH --sbatch-script PATH --make-checkpoint PATH
#   --same-output PATH
set -euo pipefail

# Each flag's PATH, absolute, in the variable of its name (--make-checkpoint: make_checkpoint);
# set -u stops the script at the first use of a flag not given.
while [ $# -ge 2 ]; do
  printf -v "$(tr - _ <<<"${1#--}")" %s "$(realpath "$2")"
  shift 2
done
for tool in munged mungekey slurmctld slurmd sbatch squeue scancel scontrol sinfo srun; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is missing (tools/setup.sh installs slurm-wlm munge)"; exit 1; }
done

# Short path: munge's socket must fit a sockaddr_un (Bazel's TEST_TMPDIR does not).
base=$(mktemp -d /tmp/reshard-slurm.XXXXXX)
chmod 755 "$base"  # munged wants every folder above its socket searchable by all
export SLURM_CONF=$base/slurm/etc/slurm.conf

stop_slurm() {
  local pids mpid
  pids=$(cat "$base"/slurm/run/slurmctld.pid "$base"/slurm/run/slurmd.pid 2>/dev/null || true)
  mpid=$(cat "$base"/munge/run/munged.pid 2>/dev/null || true)
  # scontrol retries for a minute when no controller answers: only ask one that runs.
  [ -n "$pids" ] && timeout 10 scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do
    local alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "$mpid" ] && kill "$mpid" 2>/dev/null || true
}
cleanup() {
  local status=$?
  if [ $status -ne 0 ]; then
    echo "--- slurmctld.log (tail)"; tail -n 30 "$base"/slurm/log/slurmctld.log 2>/dev/null || true
    echo "--- slurmd.log (tail)"; tail -n 30 "$base"/slurm/log/slurmd.log 2>/dev/null || true
    for f in "$base"/logs/*.out; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  fi
  stop_slurm
  rm -rf "$base"
  exit $status
}
trap cleanup EXIT

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_slurm() {
  local host ctld_port slurmd_port
  host=$(hostname -s)
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  mkdir -p "$base"/munge/{etc,run,log,lib} "$base"/slurm/{etc,state,spool,run,log} "$base"/logs
  chmod 700 "$base"/munge/etc "$base"/munge/lib "$base"/munge/log
  chmod 755 "$base"/munge/run
  mungekey --create --keyfile="$base"/munge/etc/munge.key
  chmod 400 "$base"/munge/etc/munge.key
  munged --key-file="$base"/munge/etc/munge.key --socket="$base"/munge/run/munge.socket.2 \
    --pid-file="$base"/munge/run/munged.pid --log-file="$base"/munge/log/munged.log \
    --seed-file="$base"/munge/lib/munged.seed
  cat >"$SLURM_CONF" <<CONF
ClusterName=reshardtest
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$base/munge/run/munge.socket.2
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$base/slurm/state
SlurmdSpoolDir=$base/slurm/spool
SlurmctldPidFile=$base/slurm/run/slurmctld.pid
SlurmdPidFile=$base/slurm/run/slurmd.pid
SlurmctldLogFile=$base/slurm/log/slurmctld.log
SlurmdLogFile=$base/slurm/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MinJobAge=4
KillWait=2
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=${host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=4096 State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF
  slurmctld -c -f "$SLURM_CONF"
  slurmd -c -f "$SLURM_CONF"
  for _ in $(seq 1 120); do
    [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && return 0
    sleep 0.25
  done
  echo "FAIL: slurm did not become idle"
  return 1
}

# Waits until Slurm has no job left (sbatch --wait is not used for jobs that are cancelled).
wait_for_empty_queue() {
  for _ in $(seq 1 600); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  echo "FAIL: jobs still queued: $(squeue -h)"
  return 1
}

# Every file of the single-worker output, byte for byte; the manifest's file and tensor lists.
same_as_reference() {
  local out=$1
  /usr/bin/python3 "$same_output" "$base/ref" "$out"
  [ ! -e "$(dirname "$out")/.$(basename "$out").reshard-partitions" ] || { echo "FAIL: the shared area of $out was not removed"; return 1; }
}

start_slurm
echo "slurm ready: $(sinfo -h -o '%N %T %c CPUs')"

# A Hugging Face sharded checkpoint that plans to 9 data files (4 tasks of 2 CPUs run at once).
/usr/bin/python3 "$make_checkpoint" --size 48MiB --quiet "$base/in" >/dev/null
cp "$reshardctl" "$base/reshardctl"
args="--max-shard-size 6MB"
# shellcheck disable=SC2086
"$base/reshardctl" consolidate "$base/in" "$base/ref" $args --no-progress >/dev/null
"$base/reshardctl" plan "$base/in" $args --partitions 4

export RESHARDCTL=$base/reshardctl RESHARD_IN=$base/in RESHARD_ARGS=$args
mkdir -p "$base/results"

echo "== 1. a 4-task array publishes the same output as one worker"
RESHARD_OUT=$base/out RESHARD_RESULT_DIR=$base/results \
  sbatch --wait --array=0-3 --output="$base/logs/%A_%a.out" "$sbatch_script" >/dev/null
same_as_reference "$base/out"
/usr/bin/python3 - "$base/results" "$base/ref" <<'PY'
import json, os, sys
results = [json.load(open(os.path.join(sys.argv[1], f))) for f in sorted(os.listdir(sys.argv[1]))]
data_files = sorted(f for f in os.listdir(sys.argv[2]) if f.startswith("model-"))
assert len(results) == 4, len(results)
assert sorted(r["partition"]["index"] for r in results) == [0, 1, 2, 3]
published = [r["partition"]["index"] for r in results if r["published"]]
assert len(published) == 1, f"exactly one task publishes, not {published}"
written = sorted(f["name"] for r in results for f in r["files"] if f["name"].startswith("model-"))
assert written == data_files, (written, data_files)
print(f"4 tasks, task {published[0]} published; each data file written once")
PY

echo "== 2. a task cancelled mid-way publishes nothing; rerunning its index completes the output"
# Every task stops after its first committed file until the release file appears.
export RESHARD_TEST_FAULTS="partition-file-committed=wait:$base/release"
job=$(RESHARD_OUT=$base/out2 sbatch --parsable --array=0-3 --output="$base/logs/%A_%a.out" "$sbatch_script")
area=$base/.out2.reshard-partitions
for _ in $(seq 1 600); do
  # Files recorded (each task appends a line per file to its log in data/.reshard-progress/).
  n=$( (cat "$area"/data/.reshard-progress/*.jsonl 2>/dev/null || true) | grep -c '"name"' || true)
  [ "$n" -ge 4 ] && break
  sleep 0.2
done
[ "$n" -ge 4 ] || { echo "FAIL: not every task committed a file"; squeue; exit 1; }
scancel "${job}_2"
# scancel returns before the task has its signal: release the others only once task 2 has left
# the queue, or it could be released too and finish its partition.
for _ in $(seq 1 600); do
  squeue -h -o %i -j "${job}_2" 2>/dev/null | grep -q . || break
  sleep 0.2
done
touch "$base/release"
wait_for_empty_queue
unset RESHARD_TEST_FAULTS
[ ! -e "$base/out2" ] || { echo "FAIL: out2 was published without partition 2"; exit 1; }
[ ! -e "$area/partition-00002-of-00004.json" ] || { echo "FAIL: the cancelled task recorded its files"; exit 1; }
for i in 0 1 3; do
  [ -e "$area/partition-0000$i-of-00004.json" ] || { echo "FAIL: task $i did not record its files"; exit 1; }
done
if "$base/reshardctl" commit "$base/out2" >"$base/commit.txt" 2>&1; then
  echo "FAIL: commit published without partition 2"; exit 1
fi
grep -q "partitions 2 of 4 have not recorded" "$base/commit.txt" || { cat "$base/commit.txt"; exit 1; }
echo "task 2 cancelled: nothing published, commit refuses ($(head -c 120 "$base/commit.txt"))"

# The files the cancelled task had committed (its file records, less the other tasks' files):
# its rerun must reuse them.
committed=$(/usr/bin/python3 -c '
import json, pathlib, sys
area = pathlib.Path(sys.argv[1])
others = {f["name"] for i in (0, 1, 3)
          for f in json.load(open(area / f"partition-0000{i}-of-00004.json"))["files"]}
recorded = {json.loads(line)["name"] for p in (area / "data/.reshard-progress").glob("*.jsonl")
            for line in open(p) if line.strip()}
print(" ".join(sorted(recorded - others)))' "$area")
[ -n "$committed" ] || { echo "FAIL: no file record of the cancelled task"; exit 1; }
# Each file's inode: a file written again is a new file renamed over the old one.
declare -A inode
for name in $committed; do inode[$name]=$(stat -c %i "$area/data/$name"); done

RESHARD_OUT=$base/out2 RESHARD_PARTITION_COUNT=4 RESHARD_RESULT_DIR=$base/results \
  sbatch --wait --array=2 --output="$base/logs/%A_%a.out" "$sbatch_script" >/dev/null
same_as_reference "$base/out2"
for name in $committed; do
  [ "$(stat -c %i "$base/out2/$name")" = "${inode[$name]}" ] ||
    { echo "FAIL: $name was rewritten by the rerun of task 2 instead of reused"; exit 1; }
done
echo "rerun of task 2 reused its committed $committed"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["published"] and r["partition"] == {"index": 2, "count": 4, "recorded": 4}, r
print("rerun of task 2 published:", r["partition"])
' "$base/results/partition-2.json"

echo "== 3. commit of a published output is a no-op"
"$base/reshardctl" commit "$base/out2"

echo "== 4. srun -n 2 inside each task of a 2-task array: four partitions, one per step task"
cat >"$base/srun-in-array.sh" <<SH
#!/bin/bash
exec srun -n 2 "$sbatch_script"
SH
chmod +x "$base/srun-in-array.sh"
mkdir -p "$base/results4"
RESHARD_OUT=$base/out4 RESHARD_RESULT_DIR=$base/results4 \
  sbatch --wait --array=0-1 -n 2 --output="$base/logs/%A_%a.out" "$base/srun-in-array.sh" >/dev/null
same_as_reference "$base/out4"
/usr/bin/python3 - "$base/results4" <<'PY'
import json, os, sys
names = sorted(os.listdir(sys.argv[1]))
assert names == ["partition-0-0.json", "partition-0-1.json", "partition-1-0.json",
                 "partition-1-1.json"], names
results = [json.load(open(os.path.join(sys.argv[1], f))) for f in names]
assert [r["partition"]["index"] for r in results] == [0, 1, 2, 3], [r["partition"] for r in results]
assert all(r["partition"]["count"] == 4 for r in results), [r["partition"] for r in results]
published = [r["partition"]["index"] for r in results if r["published"]]
assert len(published) == 1, f"exactly one step task publishes, not {published}"
print(f"2 array tasks x 2 step tasks = partitions 0-3 of 4; {published[0]} published")
PY
echo "PASS"
