"""Shared pieces of the reshardd end-to-end suites (daemon_test.py, daemon_zero_test.py): a real
daemon per test class, reshardctl and grpc_probe runners, metrics and checkpoint helpers.

Run (from the repository root, after `bazel build //server:reshardd //client:reshardctl
//tests/daemon:grpc_probe`):

    /usr/bin/python3 tests/daemon/daemon_test.py --reshardd bazel-bin/server/reshardd \
        --reshardctl bazel-bin/client/reshardctl --probe bazel-bin/tests/daemon/grpc_probe \
        [unittest args, e.g. CoreTests or SecurityTests.test_full_queue]

Every test class starts its own real daemon on ephemeral loopback ports (`--listen 127.0.0.1:0
--metrics-listen 127.0.0.1:0`) with its own state dir and allowed root, and kills it at the end.
Outputs are checked element by element with tests/st_reference.py (an independent numpy
safetensors reader) against the source checkpoints, which tools/bench/make_checkpoint.py writes.
ZeroTests reads a DeepSpeed ZeRO-3 checkpoint that tests/fixtures/zero_fixture.py writes with real
PyTorch (only that class imports torch) and compares with torch.equal.
`--probe` (tests/daemon/grpc_probe.cc) sends raw gRPC requests: paths that reshardctl would
normalize, and grpc.health.v1 checks. RESHARD_DAEMON_TEST_KEEP_TMP=1 keeps the temp folders.
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import numpy as np

sys.dont_write_bytecode = True

PY = "/usr/bin/python3"
RESHARDD = None
RESHARDCTL = None
PROBE = None
STAGING_SUFFIX = ".reshard-staging"
MANIFEST = "reshard-manifest.json"
INDEX = "model.safetensors.index.json"
TERMINAL = ("succeeded", "failed", "cancelled")
# A job that runs for a few seconds on 2 cores: 1 GiB of F32 converted to BF16 by one thread
# (the window size is not part of the job spec, so the dtype conversion is what slows it).
BIG_SIZE = "1GiB"
BIG_ARGS = ("--dtype", "bf16", "--threads", "1", "--max-shard-size", "150MB")
# Variables that would give reshardctl a default server or idempotency key.
SCRUBBED_ENV = ("RESHARD_SERVER", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                "JOB_COMPLETION_INDEX")

_DAEMONS = []  # every daemon process started, killed at exit whatever happens


def _find_source(rel):
    """A file of the repository: from Bazel runfiles, else beside this file's real path."""
    candidates = []
    if os.environ.get("TEST_SRCDIR"):
        candidates.append(os.path.join(os.environ["TEST_SRCDIR"], "reshard", rel))
    for here in (os.path.dirname(os.path.realpath(__file__)),
                 os.path.dirname(os.path.abspath(__file__))):
        candidates.append(os.path.join(here, "..", "..", rel))
    for c in candidates:
        if os.path.exists(c):
            return os.path.normpath(c)
    raise RuntimeError("cannot find %s (looked at %s)" % (rel, candidates))


sys.path.insert(0, os.path.dirname(_find_source("tests/st_reference.py")))
import st_reference as R  # noqa: E402

MAKE_CHECKPOINT = _find_source("tools/bench/make_checkpoint.py")

RULES = {"rules": [
    {"pattern": r"(q|k|v|gate|up)_proj\.weight$", "split_dim": 0},
    {"pattern": r"(o|down)_proj\.weight$", "split_dim": 1},
    {"pattern": r"(embed_tokens|lm_head)\.weight$", "split_dim": 0},
    {"pattern": r".*", "replicate": True},
]}


# ------------------------------------------------------------------------------------------------
# Helpers


def tail(text, n=3000):
    return text if len(text) <= n else "..." + text[-n:]


def staging_path(out):
    out = os.path.abspath(out).rstrip("/")
    return os.path.join(os.path.dirname(out), "." + os.path.basename(out) + STAGING_SUFFIX)


def make_checkpoint(path, size, max_shard, *extra):
    r = subprocess.run([PY, MAKE_CHECKPOINT, path, "--size", size, "--max-shard-size", max_shard,
                        "--quiet"] + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("make_checkpoint failed: %s" % r.stderr)
    return path


def small_checkpoint(path, seed=0):
    """About 2 MiB, 4 shards, 21 tensors."""
    return make_checkpoint(path, "2MiB", "600KB", "--hidden", "64", "--layers", "2",
                           "--seed", str(seed))


def free_closed_port():
    """A loopback port nothing listens on (bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_XXH = None


def xxh3_64_file(path):
    """XXH3-64 (seed 0) of a file with the system libxxhash (upstream xxHash, not reshard)."""
    global _XXH
    if _XXH is None:
        lib = ctypes.CDLL("libxxhash.so.0")
        lib.XXH3_64bits.restype = ctypes.c_uint64
        lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _XXH = lib
    with open(path, "rb") as f:
        data = f.read()
    return "%016x" % _XXH.XXH3_64bits(data, len(data))


def parse_metrics(text):
    """Prometheus text format -> {(name, ((label, value), ...)): float}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)", line)
        if not m:
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(metrics, name, **labels):
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def progress_of(doc):
    """(bytes_done, bytes_total) of a job document (unset fields are left out of the JSON)."""
    p = doc["job"].get("progress", {})
    return int(p.get("bytes_done", 0)), int(p.get("bytes_total", 0))


class Result(object):
    def __init__(self, cmd, rc, stdout, stderr, doc):
        self.cmd, self.rc, self.stdout, self.stderr, self.doc = cmd, rc, stdout, stderr, doc

    def __repr__(self):
        return "$ %s\nexit %d\nstdout: %s\nstderr: %s" % (
            " ".join(self.cmd), self.rc, tail(self.stdout), tail(self.stderr))


def run_ctl(args, server=None, json_out=True, env=None, timeout=180):
    """Runs reshardctl ARGS [--server S] [--json]; with --json, stdout must be one JSON document."""
    cmd = [RESHARDCTL] + list(args)
    if server is not None:
        cmd += ["--server", server]
    if json_out:
        cmd.append("--json")
    full_env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    full_env.update(env or {})
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL, env=full_env, timeout=timeout)
    doc = None
    if json_out and r.stdout.strip():
        try:
            doc = json.loads(r.stdout)  # raises on anything but exactly one document
        except ValueError as e:
            raise AssertionError("stdout of %s is not one JSON document (%s):\n%s" %
                                 (" ".join(cmd), e, tail(r.stdout)))
    return Result(cmd, r.returncode, r.stdout, r.stderr, doc)


def probe(addr, method, request=None, timeout=30):
    """Raw gRPC call through grpc_probe -> {"code", "code_name", "message", "response"}."""
    if PROBE is None:
        raise unittest.SkipTest("needs --probe (bazel build //tests/daemon:grpc_probe)")
    text = json.dumps(request or {})
    r = subprocess.run([PROBE, addr, method, "-"], input=text, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError("grpc_probe failed: %s %s" % (r.stdout, r.stderr))
    return json.loads(r.stdout)


class Daemon(object):
    """A reshardd process on ephemeral loopback ports."""

    def __init__(self, log_dir, state_dir, roots, extra=(), env=None):
        self.log_dir, self.state_dir, self.roots, self.extra = log_dir, state_dir, roots, extra
        self.env = env  # extra environment variables (e.g. RESHARD_TEST_FAULTS)
        self.proc = None
        self.addr = self.metrics_addr = None
        self.starts = 0
        self.log_path = None

    def start(self, timeout=30):
        self.starts += 1
        self.log_path = os.path.join(self.log_dir, "reshardd-%d-%d.log" % (id(self), self.starts))
        cmd = [RESHARDD, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--state-dir", self.state_dir]
        for root in self.roots:
            cmd += ["--allowed-root", root]
        cmd += list(self.extra)
        with open(self.log_path, "w") as log:
            env = dict(os.environ)
            env.update(self.env or {})
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                         stdin=subprocess.DEVNULL, env=env)
        _DAEMONS.append(self.proc)
        lines = []
        got = threading.Event()

        def reader(stream=self.proc.stdout):
            with stream:
                for line in stream:
                    lines.append(line.strip())
                    if any(l.startswith("listening on ") for l in lines) and \
                            any(l.startswith("metrics on ") for l in lines):
                        got.set()
            got.set()

        threading.Thread(target=reader, daemon=True).start()
        if not got.wait(timeout) or self.proc.poll() is not None and not self.addr_from(lines):
            self.kill()
            raise AssertionError("reshardd did not start: stdout %r, log:\n%s" %
                                 (lines, tail(self.read_log())))
        if not self.addr_from(lines):
            self.kill()
            raise AssertionError("reshardd printed no addresses: %r\n%s" %
                                 (lines, tail(self.read_log())))
        return self

    def addr_from(self, lines):
        listen = [l[len("listening on "):] for l in lines if l.startswith("listening on ")]
        metrics = [l[len("metrics on "):] for l in lines if l.startswith("metrics on ")]
        if not listen or not metrics:
            return False
        self.addr, self.metrics_addr = listen[0], metrics[0]
        assert re.match(r"^127\.0\.0\.1:\d+$", self.addr), self.addr
        assert re.match(r"^127\.0\.0\.1:\d+$", self.metrics_addr), self.metrics_addr
        assert not self.addr.endswith(":0") and not self.metrics_addr.endswith(":0")
        return True

    def read_log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def metrics(self, timeout=10):
        with urllib.request.urlopen("http://%s/metrics" % self.metrics_addr,
                                    timeout=timeout) as response:
            return parse_metrics(response.read().decode("utf-8"))

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def _kill_all_daemons():
    for proc in _DAEMONS:
        if proc.poll() is None:
            proc.kill()


# ------------------------------------------------------------------------------------------------
# Base class


class DaemonTestCase(unittest.TestCase):
    """Per class: a temp folder with `root/` (the only allowed root), `state/`, and a daemon."""

    maxDiff = 4000
    DAEMON_ARGS = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="reshardd-test-%s-" % cls.__name__)
        cls.root = os.path.join(cls.tmp, "root")
        cls.outside = os.path.join(cls.tmp, "outside")
        cls.logs = os.path.join(cls.tmp, "logs")
        for d in (cls.root, cls.outside, cls.logs):
            os.makedirs(d)
        cls.daemon = Daemon(cls.logs, os.path.join(cls.tmp, "state"), [cls.root],
                            cls.DAEMON_ARGS).start()
        cls.extra_daemons = []

    @classmethod
    def tearDownClass(cls):
        for d in [cls.daemon] + cls.extra_daemons:
            d.kill()
        if os.environ.get("RESHARD_DAEMON_TEST_KEEP_TMP"):
            sys.stderr.write("kept %s\n" % cls.tmp)
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def tearDown(self):
        # Make sure the class daemon is still up for the next test (a crash is a failure here).
        if not self.daemon.alive():
            log = tail(self.daemon.read_log())
            self.daemon.start()
            self.fail("reshardd died during %s; log:\n%s" % (self._testMethodName, log))

    # -- paths ---------------------------------------------------------------------------------

    def r(self, *parts):
        return os.path.join(self.root, *parts)

    # -- reshardctl ----------------------------------------------------------------------------

    def ctl(self, *args, **kw):
        daemon = kw.pop("daemon", None) or self.daemon
        return run_ctl(args, server=daemon.addr, **kw)

    def assertExit(self, result, code):
        self.assertEqual(result.rc, code, "unexpected exit code:\n%r" % result)

    def assertOk(self, result):
        self.assertExit(result, 0)
        self.assertIsNotNone(result.doc, repr(result))
        self.assertIs(result.doc.get("ok"), True, repr(result))
        self.assertEqual(result.doc.get("exit_code"), 0, repr(result))
        return result.doc

    def assertError(self, result, exit_code, code_name, message_re=None):
        """A failure: exit code, and the error document {"ok": false, "exit_code", "error"}."""
        self.assertExit(result, exit_code)
        self.assertIsNotNone(result.doc, repr(result))
        self.assertIs(result.doc.get("ok"), False, repr(result))
        self.assertEqual(result.doc.get("exit_code"), exit_code, repr(result))
        self.assertEqual(result.doc["error"]["code"], code_name, repr(result))
        self.assertTrue(result.doc["error"]["message"], repr(result))
        if message_re:
            self.assertRegex(result.doc["error"]["message"], message_re, repr(result))
        return result.doc

    def submit(self, src, out, *args, **kw):
        """consolidate --detach; returns the job id."""
        doc = self.assertOk(self.ctl("consolidate", src, out, "--detach", *args, **kw))
        self.assertRegex(doc["job_id"], r"^\S+$")
        self.assertIn(doc["state"], ("queued", "running", "succeeded"), doc)
        return doc["job_id"]

    def status(self, job_id, daemon=None):
        r = self.ctl("status", job_id, daemon=daemon)
        self.assertIsNotNone(r.doc, repr(r))
        self.assertIn("state", r.doc, repr(r))
        self.assertEqual(r.doc["job_id"], job_id)
        return r.doc

    def wait_for(self, job_id, predicate, what, timeout=120, daemon=None, interval=0.05):
        deadline = time.monotonic() + timeout
        doc = None
        while time.monotonic() < deadline:
            doc = self.status(job_id, daemon=daemon)
            if predicate(doc):
                return doc
            time.sleep(interval)
        self.fail("job %s: %s not reached in %ss; last: %s" %
                  (job_id, what, timeout, json.dumps(doc)[:2000]))

    def wait_terminal(self, job_id, timeout=180, daemon=None):
        return self.wait_for(job_id, lambda d: d["state"] in TERMINAL, "a terminal state",
                             timeout=timeout, daemon=daemon, interval=0.1)

    def wait_running_with_progress(self, job_id, fraction=0.05, daemon=None):
        """Waits until the job has written at least `fraction` of its bytes (not finished)."""
        def ok(d):
            if d["state"] in TERMINAL:
                self.fail("job %s ended (%s) before the test could interrupt it; the big job is "
                          "too fast on this machine: %s" % (job_id, d["state"],
                                                            json.dumps(d)[:1500]))
            done, total = progress_of(d)
            return d["state"] == "running" and total > 0 and done >= fraction * total
        return self.wait_for(job_id, ok, "running with progress", timeout=120, daemon=daemon,
                             interval=0.02)

    # -- output checks -------------------------------------------------------------------------

    def assertNoOutput(self, out):
        self.assertFalse(os.path.exists(out), "%s exists: %s" %
                         (out, os.listdir(out) if os.path.isdir(out) else "file"))

    def assertNoStaging(self, out):
        st = staging_path(out)
        self.assertFalse(os.path.exists(st), "staging folder left behind: %s" % st)

    def assertOutputFilesMatch(self, out, doc):
        """The job's output_files name real files whose sizes and XXH3-64 match."""
        files = doc["files"]
        self.assertTrue(files, doc)
        for f in files:
            path = os.path.join(out, f["name"])
            self.assertTrue(os.path.isfile(path), "%s listed but missing" % path)
            self.assertEqual(os.path.getsize(path), int(f["bytes"]), path)
            self.assertEqual(xxh3_64_file(path), f["xxh3_64"], path)
        data_files = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))
        listed = sorted(f["name"] for f in files if f["name"].endswith(".safetensors"))
        self.assertEqual(listed, data_files)
        with open(os.path.join(out, MANIFEST)) as fh:
            manifest = json.load(fh)
        self.assertTrue(manifest)

    def assertConsolidated(self, src, out, dtype="keep"):
        """out (a one-model folder) == src converted to dtype, element by element (in memory)."""
        self.assertTrue(os.path.isdir(out), out)
        self.assertTrue(os.path.isfile(os.path.join(out, MANIFEST)), os.listdir(out))
        self.assertNoStaging(out)
        expected = R.read_folder(src)
        actual = R.read_folder(out)
        self.assertEqual(sorted(actual), sorted(expected))
        for name, tensor in expected.items():
            diff = R.diff_tensors(R.convert(tensor, dtype), actual[name])
            self.assertIsNone(diff, "%s: %s" % (name, diff))

    def assertConsolidatedStreaming(self, src, out, dtype="keep"):
        """Like assertConsolidated, one tensor at a time (for the 1 GiB checkpoints)."""
        self.assertTrue(os.path.isdir(out), out)
        self.assertTrue(os.path.isfile(os.path.join(out, MANIFEST)), os.listdir(out))
        self.assertNoStaging(out)

        def catalog(folder):
            entries = {}
            for fn in R.list_safetensors(folder):
                path = os.path.join(folder, fn)
                _, items, _, start = R.parse_header(path)
                for name, dt, shape, b, e in items:
                    self.assertNotIn(name, entries, "%s twice in %s" % (name, folder))
                    entries[name] = (path, dt, shape, start + b, e - b)
            return entries

        def load(entry):
            path, dt, shape, offset, size = entry
            with open(path, "rb") as f:
                f.seek(offset)
                buf = f.read(size)
            self.assertEqual(len(buf), size, path)
            return R.Tensor(dt, np.frombuffer(buf, dtype=R.DTYPES[dt][1]).reshape(shape))

        source, output = catalog(src), catalog(out)
        self.assertEqual(sorted(output), sorted(source))
        index = R.read_index(out) if os.path.exists(os.path.join(out, INDEX)) else None
        for name in sorted(source):
            if index is not None:
                self.assertEqual(index["weight_map"][name], os.path.basename(output[name][0]))
            diff = R.diff_tensors(R.convert(load(source[name]), dtype), load(output[name]))
            self.assertIsNone(diff, "%s: %s" % (name, diff))


# ------------------------------------------------------------------------------------------------
# 1, 7, 8: submit / watch / status / list / plan / inspect / reshard; CLI contract; metrics



class OwnDaemonsTestCase(DaemonTestCase):
    """For tests that start their own daemons (restarts, fault points): the class daemon is
    stopped, and each test makes what it needs with new_daemon."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.daemon.kill()

    def tearDown(self):
        pass  # the class daemon is not used

    def new_daemon(self, extra=(), env=None, state=None):
        """A started daemon on `state` (a new state folder when None), killed with the class."""
        if state is None:
            state = tempfile.mkdtemp(prefix="state-", dir=self.tmp)
        d = Daemon(self.logs, state, [self.root], tuple(extra), env=env)
        self.extra_daemons.append(d)
        return d.start()


def main():
    """Takes --reshardd, --reshardctl and --probe, then runs the calling module's tests."""
    global RESHARDD, RESHARDCTL, PROBE
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--reshardd", required=True)
    parser.add_argument("--reshardctl", required=True)
    parser.add_argument("--probe")
    args, rest = parser.parse_known_args()
    RESHARDD = os.path.abspath(args.reshardd)
    RESHARDCTL = os.path.abspath(args.reshardctl)
    PROBE = os.path.abspath(args.probe) if args.probe else None
    for path in (RESHARDD, RESHARDCTL) + ((PROBE,) if PROBE else ()):
        if not os.access(path, os.X_OK):
            sys.exit("not an executable: %s" % path)
    try:
        program = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, verbosity=2,
                                exit=False)
    finally:
        _kill_all_daemons()
    sys.exit(0 if program.result.wasSuccessful() else 1)

