#!/bin/bash
# deploy/kubernetes/convert-indexed-job.yaml, without a cluster: the manifest is an Indexed Job
# whose pods run `reshardctl ... --partition auto` with RESHARD_PARTITION_COUNT = completions,
# and running its container command once per index, with the variables Kubernetes sets
# (JOB_COMPLETION_INDEX) and the manifest's env, on a local checkpoint, publishes the same
# output as one worker (the last pod to finish publishes).
#
# Flags (tests/e2e.bzl): --reshardctl PATH --job-yaml PATH --make-checkpoint PATH
#   --same-output PATH
set -euo pipefail
# Each flag's PATH, absolute, in the variable of its name (--make-checkpoint: make_checkpoint);
# set -u stops the script at the first use of a flag not given.
while [ $# -ge 2 ]; do
  printf -v "$(tr - _ <<<"${1#--}")" %s "$(realpath "$2")"
  shift 2
done
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/indexed.XXXXXX")
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 "$make_checkpoint" --size 16MiB --quiet "$work/in" >/dev/null
"$reshardctl" consolidate "$work/in" "$work/ref" --dtype bf16 --no-progress >/dev/null

/usr/bin/python3 - "$job_yaml" "$reshardctl" "$work" <<'PY'
import json, os, subprocess, sys
import yaml

job_yaml, reshardctl, work = sys.argv[1:4]
job = yaml.safe_load(open(job_yaml))
assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1", job["kind"]
spec = job["spec"]
assert spec["completionMode"] == "Indexed", spec.get("completionMode")
completions = spec["completions"]
(container,) = spec["template"]["spec"]["containers"]
command = container["command"]
env = {e["name"]: e["value"] for e in container.get("env", [])}
assert command[0] == "reshardctl" and command[1] in ("consolidate", "reshard"), command
assert command[command.index("--partition") + 1] == "auto", command
assert int(env["RESHARD_PARTITION_COUNT"]) == completions, (env, completions)
mounts = {m["mountPath"] for m in container["volumeMounts"]}
for path in command[2:4]:
    assert any(path.startswith(m + "/") for m in mounts), f"{path} is not on a mounted volume"

# The pods, one after another, on the local checkpoint.
args = [reshardctl, command[1], os.path.join(work, "in"), os.path.join(work, "out")] + command[4:]
published = []
for index in range(completions):
    pod_env = dict(os.environ, JOB_COMPLETION_INDEX=str(index), **env)
    result = json.loads(subprocess.run(args, env=pod_env, check=True, capture_output=True,
                                       text=True).stdout)
    assert result["partition"]["index"] == index and result["partition"]["count"] == completions
    if result["published"]:
        published.append(index)
assert published == [completions - 1], published

print(f"{completions} indexed pods published; the last one")
PY
/usr/bin/python3 "$same_output" "$work/ref" "$work/out"
echo PASS
