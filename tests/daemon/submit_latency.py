#!/usr/bin/python3
"""Submit latency of a real reshardd while jobs run (issue 10): a measurement, not a test.

    bazel build //server:reshardd //tests/daemon:grpc_probe
    /usr/bin/python3 tests/daemon/submit_latency.py --reshardd bazel-bin/server/reshardd \
        --probe bazel-bin/tests/daemon/grpc_probe [--submits 200] [--size 1GiB]

Two busy jobs consolidate a --size checkpoint to BF16 in 1 MB shards (one thread each), so they
commit (and fsync) a file every few milliseconds and report progress all the time. While both
run, up to --submits SubmitJob calls, each followed by a GetJob of a busy job, are timed
(grpc_probe's "seconds": the call alone, once connected); each submits a small job that queues
behind the busy ones. Submits are also timed first with nothing running (a quarter as many).
Prints p50/p99/max; the state folder is on the temp folder's disk ($TMPDIR).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness as dh  # noqa: E402


def submit(addr, src, out, **spec):
    request = {"spec": dict({"kind": "JOB_KIND_CONSOLIDATE", "input": src, "output": out}, **spec)}
    r = dh.probe(addr, "SubmitJob", request)
    if r["code"] != 0:
        raise RuntimeError("submit failed: %r" % r)
    return r["response"]["id"], r["seconds"]


def get(addr, job_id):
    """(state, seconds the GetJob call took)."""
    r = dh.probe(addr, "GetJob", {"id": job_id})
    return r["response"]["state"], r["seconds"]


def state(addr, job_id):
    return get(addr, job_id)[0]


def summary(samples):
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(len(s) * q))] * 1000  # noqa: E731
    return "p50 %.1f ms  p99 %.1f ms  max %.1f ms  (n=%d)" % (pick(0.5), pick(0.99), s[-1] * 1000,
                                                             len(s))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reshardd", required=True)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--size", default="1GiB")
    args = parser.parse_args()
    dh.RESHARDD = os.path.abspath(args.reshardd)
    dh.PROBE = os.path.abspath(args.probe)
    tmp = tempfile.mkdtemp(prefix="reshardd-submit-latency-")
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(tmp, "logs"))
    os.makedirs(root)
    daemon = None
    try:
        big = dh.make_checkpoint(os.path.join(root, "big"), args.size, "256MB")
        small = dh.small_checkpoint(os.path.join(root, "small"))
        daemon = dh.Daemon(os.path.join(tmp, "logs"), os.path.join(tmp, "state"), [root],
                           ("--max-concurrent-jobs", "2", "--memory-budget", "8GiB",
                            "--max-queue", str(2 * args.submits + 10))).start()

        idle = []
        for i in range(args.submits // 4):
            job_id, seconds = submit(daemon.addr, small, os.path.join(root, "idle%d" % i))
            idle.append(seconds)
            while state(daemon.addr, job_id) not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"):
                time.sleep(0.01)

        busy = [submit(daemon.addr, big, os.path.join(root, "busy%d" % i),
                       max_shard_size=1 << 20, threads=1, dtype="DTYPE_BF16")[0]
                for i in range(2)]
        deadline = time.monotonic() + 60
        while any(state(daemon.addr, b) != "JOB_STATE_RUNNING" for b in busy):
            if time.monotonic() > deadline:
                raise RuntimeError("the busy jobs did not start")
            time.sleep(0.01)
        loaded, gets = [], []
        for i in range(args.submits):
            # Only calls made while both busy jobs run count.
            if i % 10 == 0 and any(state(daemon.addr, b) != "JOB_STATE_RUNNING" for b in busy):
                break
            loaded.append(submit(daemon.addr, small, os.path.join(root, "queued%d" % i),
                                 priority=-1)[1])
            gets.append(get(daemon.addr, busy[i % 2])[1])
            time.sleep(0.005)
        print("submit, nothing running:      %s" % summary(idle))
        print("submit, 2 busy jobs running:  %s" % summary(loaded))
        print("get,    2 busy jobs running:  %s" % summary(gets))
        if len(loaded) < args.submits:
            print("note: the busy jobs ended after %d submits; a larger --size runs longer"
                  % len(loaded))
    finally:
        if daemon is not None:
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
