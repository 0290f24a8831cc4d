"""reshardd's metrics, dashboard and alert rules against a real Prometheus (issue 6's Acceptance).

Run (from the repository root, after `bazel build //server:reshardd //client:reshardctl`):

    /usr/bin/python3 tests/observability/observability_test.py \
        --reshardd bazel-bin/server/reshardd --reshardctl bazel-bin/client/reshardctl

It starts a reshardd (`--metrics-listen 127.0.0.1:0`) and a Prometheus server (Debian's
`prometheus` package, /usr/bin/prometheus) on a free loopback port with its own storage in a
temp folder, scraping the daemon every second with a configuration generated from
deploy/prometheus/prometheus.yml (target and intervals substituted) and
deploy/prometheus/alerts.yml as its rule file. Then, through Prometheus's HTTP API:

- while a slow job runs (600 MiB of F32 to BF16, one thread, 16 KiB windows): written-bytes
  throughput is non-zero and reshard_jobs_running is 1;
- after it: the duration histogram, the phase histograms and the bytes, tensors and files
  counters moved by exactly the job's figures;
- every PromQL expression of deploy/grafana/reshard-dashboard.json returns data (Grafana
  variables substituted: $__rate_interval -> 1m, $instance -> .+, ...);
- every alert expression evaluates, and returns data once its thresholds are turned into
  `bool` comparisons; every rule evaluates with health "ok" inside Prometheus;
- `promtool check config`, `promtool check rules` and `promtool check metrics` (on the
  daemon's /metrics) report no problem; the dashboard is valid JSON with unique panel ids and
  its data source as a variable.

Everything listens on 127.0.0.1 only; every wait has a deadline. RESHARD_OBS_TEST_KEEP_TMP=1
keeps the temp folder (logs, Prometheus config).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True

PY = "/usr/bin/python3"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
RESHARDD = None
RESHARDCTL = None
SCRUBBED_ENV = ("RESHARD_SERVER", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
                "JOB_COMPLETION_INDEX")
# Values for Grafana's variables when the dashboard's queries are sent to Prometheus directly.
GRAFANA_VARIABLES = [
    ("${__rate_interval}", "1m"), ("$__rate_interval", "1m"),
    ("${__interval}", "15s"), ("$__interval", "15s"),
    ("${__range}", "1h"), ("$__range", "1h"),
    ("${instance}", ".+"), ("$instance", ".+"),
]
# The slow job: about 600 MiB of F32 converted to BF16 by one thread through 16 KiB windows
# (about 5 s on 2 cores; with 1 MiB windows it takes 1.4 s, too short for 1 s scrapes).
SLOW_SIZE = "600MiB"
SLOW_ARGS = ("--dtype", "bf16", "--threads", "1", "--window-size", "16KiB",
             "--max-shard-size", "100MB")

_PROCS = []  # every process started, killed at exit whatever happens


def _find_source(rel):
    """A file of the repository: from Bazel runfiles, else relative to this file."""
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


MAKE_CHECKPOINT = _find_source("tools/bench/make_checkpoint.py")
PROMETHEUS_YML = _find_source("deploy/prometheus/prometheus.yml")
ALERTS_YML = _find_source("deploy/prometheus/alerts.yml")
DASHBOARD = _find_source("deploy/grafana/reshard-dashboard.json")


def tail(text, n=3000):
    return text if len(text) <= n else "..." + text[-n:]


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_checkpoint(path, size, max_shard, *extra):
    r = subprocess.run([PY, MAKE_CHECKPOINT, path, "--size", size, "--max-shard-size", max_shard,
                        "--quiet"] + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("make_checkpoint failed: %s" % r.stderr)
    return path


def run(cmd, timeout=60, stdin_text=None):
    return subprocess.run(cmd, input=stdin_text, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


def ctl(server, *args, timeout=120):
    """reshardctl ARGS --server S --json -> (exit code, document or None, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    r = subprocess.run([RESHARDCTL] + list(args) + ["--server", server, "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       text=True, env=env, timeout=timeout)
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r.returncode, doc, r.stderr


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


def start_with_address(cmd, log_path, prefixes, timeout=30):
    """Starts `cmd`, waits for stdout lines starting with each prefix; returns (proc, values)."""
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            text=True)
    log.close()
    _PROCS.append(proc)
    found = {}
    done = threading.Event()

    def reader():
        with proc.stdout:
            for line in proc.stdout:
                for p in prefixes:
                    if line.startswith(p):
                        found[p] = line[len(p):].strip()
                if len(found) == len(prefixes):
                    done.set()
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    done.wait(timeout)
    if len(found) != len(prefixes):
        proc.kill()
        with open(log_path) as f:
            raise AssertionError("%s did not start: %r\n%s" % (cmd[0], found, tail(f.read())))
    return proc, [found[p] for p in prefixes]


def insert_bool(expr):
    """Adds `bool` after every comparison operator outside label matchers and strings, so a
    filtering alert expression returns its 0/1 value instead of nothing."""
    out = []
    i, depth, quote = 0, 0, None
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            m = re.match(r"(==|!=|>=|<=|>|<)", expr[i:])
            if m:
                op = m.group(1)
                rest = expr[i + len(op):]
                out.append(op)
                if not re.match(r"\s*bool\b", rest):
                    out.append(" bool")
                i += len(op)
                continue
        out.append(c)
        i += 1
    return "".join(out)


def cleanup():
    for proc in _PROCS:
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class ObservabilityTest(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        for tool in (PROMETHEUS, PROMTOOL):
            if not os.access(tool, os.X_OK):
                raise AssertionError("%s is missing: run tools/setup.sh (Debian package "
                                     "prometheus)" % tool)
        cls.tmp = tempfile.mkdtemp(prefix="reshard-obs-test-",
                                   dir=os.environ.get("TEST_TMPDIR"))
        cls.root = os.path.join(cls.tmp, "root")
        os.makedirs(cls.root)
        cls.reshardd, (cls.addr, cls.metrics_addr) = start_with_address(
            [RESHARDD, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--state-dir", os.path.join(cls.tmp, "state"), "--allowed-root", cls.root],
            os.path.join(cls.tmp, "reshardd.log"), ["listening on ", "metrics on "])
        assert re.match(r"^127\.0\.0\.1:\d+$", cls.metrics_addr), cls.metrics_addr

        # The scrape configuration and rules that ship, with this test's target and a 1 s
        # interval; the rule file is copied beside the config (its path there is relative).
        with open(PROMETHEUS_YML) as f:
            config = f.read()
        for old, new in (("localhost:9464", cls.metrics_addr),
                         ("scrape_interval: 15s", "scrape_interval: 1s"),
                         ("evaluation_interval: 15s", "evaluation_interval: 1s")):
            if old not in config:
                raise AssertionError("%s no longer holds %r; update this test" %
                                     (PROMETHEUS_YML, old))
            config = config.replace(old, new)
        cls.prom_dir = os.path.join(cls.tmp, "prometheus")
        os.makedirs(cls.prom_dir)
        cls.config_path = os.path.join(cls.prom_dir, "prometheus.yml")
        with open(cls.config_path, "w") as f:
            f.write(config)
        shutil.copy(ALERTS_YML, os.path.join(cls.prom_dir, "alerts.yml"))

        cls.prom_port = free_port()
        cls.prom_url = "http://127.0.0.1:%d" % cls.prom_port
        prom_log = open(os.path.join(cls.tmp, "prometheus.log"), "w")
        cls.prometheus = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + cls.config_path,
             "--storage.tsdb.path=" + os.path.join(cls.prom_dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % cls.prom_port, "--log.level=warn"],
            stdout=prom_log, stderr=prom_log, stdin=subprocess.DEVNULL, cwd=cls.prom_dir)
        prom_log.close()
        _PROCS.append(cls.prometheus)
        deadline = time.monotonic() + 30
        while True:
            try:
                http_get(cls.prom_url + "/-/ready", timeout=2)
                break
            except (urllib.error.URLError, OSError):
                if cls.prometheus.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("prometheus did not start:\n" + cls.prom_log())
                time.sleep(0.2)

        # Checkpoints: the slow job's while Prometheus gathers its first scrapes, a small one.
        cls.slow_src = make_checkpoint(os.path.join(cls.root, "slow"), SLOW_SIZE, "200MB")
        cls.small_src = make_checkpoint(os.path.join(cls.root, "small"), "2MiB", "600KB",
                                        "--hidden", "64", "--layers", "2")

    @classmethod
    def tearDownClass(cls):
        cleanup()
        if os.environ.get("RESHARD_OBS_TEST_KEEP_TMP"):
            sys.stderr.write("kept %s\n" % cls.tmp)
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def prom_log(cls):
        try:
            with open(os.path.join(cls.tmp, "prometheus.log")) as f:
                return tail(f.read())
        except OSError:
            return ""

    # -- Prometheus API ------------------------------------------------------------------------

    def query(self, expr):
        """Instant query -> the API's data (raises with Prometheus's error on failure)."""
        url = self.prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            body = json.loads(e.read().decode("utf-8"))
        if body.get("status") != "success":
            raise AssertionError("query failed: %s\n  %s: %s" %
                                 (expr, body.get("errorType"), body.get("error")))
        return body["data"]

    def value(self, expr):
        """The single sample of `expr` as a float (None when there is none)."""
        data = self.query(expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return float(result[1])
        if not result:
            return None
        self.assertEqual(len(result), 1, "%s: %s" % (expr, result))
        return float(result[0]["value"][1])

    def wait_value(self, expr, predicate, what, timeout=30):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.value(expr)
            if last is not None and predicate(last):
                return last
            time.sleep(0.25)
        self.fail("%s: %s not reached in %ss (last %r)\nprometheus log:\n%s" %
                  (expr, what, timeout, last, self.prom_log()))

    def scraped_total(self, name, **labels):
        sel = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
        return self.value('sum(%s{job="reshard"%s})' % (name, "," + sel if sel else ""))

    # -- the test ------------------------------------------------------------------------------

    def test_metrics_dashboard_and_alerts(self):
        self.check_tools()
        self.wait_value('up{job="reshard"}', lambda v: v == 1, "target up")
        self.check_job_through_prometheus()
        self.check_dashboard_queries()
        self.check_alert_rules()

    def check_tools(self):
        r = run([PROMTOOL, "check", "config", self.config_path])
        self.assertEqual(r.returncode, 0, "promtool check config:\n%s%s" % (r.stdout, r.stderr))
        self.assertIn("SUCCESS", r.stdout + r.stderr)
        r = run([PROMTOOL, "check", "rules", ALERTS_YML])
        self.assertEqual(r.returncode, 0, "promtool check rules:\n%s%s" % (r.stdout, r.stderr))
        self.assertRegex(r.stdout + r.stderr, r"SUCCESS: \d+ rules found")
        # Problems are printed one a line; none are allowed (exposition and naming lint).
        text = http_get("http://%s/metrics" % self.metrics_addr)
        r = run([PROMTOOL, "check", "metrics"], stdin_text=text)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""),
                         "promtool check metrics reported problems")
        for name in ("process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
                     "process_start_time_seconds", "process_threads",
                     "reshard_build_info", "grpc_server_handled_total",
                     "reshard_job_phase_duration_seconds_bucket"):
            self.assertRegex(text, r"(?m)^%s[{ ]" % name)
        self.check_dashboard_json()

    def check_dashboard_json(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        panels = []

        def walk(items):
            for p in items:
                panels.append(p)
                walk(p.get("panels", []))

        walk(dash["panels"])
        ids = [p["id"] for p in panels]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are not unique: %s" % ids)
        self.assertTrue(all(isinstance(i, int) for i in ids), ids)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        self.assertEqual(variables["DS_PROMETHEUS"]["type"], "datasource")
        self.assertEqual(variables["DS_PROMETHEUS"]["query"], "prometheus")
        for p in panels:
            if p["type"] == "row":
                continue
            self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
                             p["title"])
            self.assertTrue(p["targets"], p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"]["uid"], "${DS_PROMETHEUS}", p["title"])
        self.assertIsInstance(dash["schemaVersion"], int)
        self.assertTrue(dash["uid"] and dash["title"])

    def check_job_through_prometheus(self):
        before = {
            "written": self.scraped_total("reshard_written_bytes_total"),
            "read": self.scraped_total("reshard_read_bytes_total"),
            "tensors": self.scraped_total("reshard_tensors_written_total"),
            "files": self.scraped_total("reshard_files_written_total"),
            "count": self.scraped_total("reshard_job_duration_seconds_count", kind="consolidate"),
            "sum": self.scraped_total("reshard_job_duration_seconds_sum", kind="consolidate"),
            "plan": self.scraped_total("reshard_job_phase_duration_seconds_count", phase="plan"),
            "succeeded": self.scraped_total("reshard_jobs_finished_total", kind="consolidate",
                                            result="succeeded"),
        }
        self.assertEqual(before["count"], 0, before)
        out = os.path.join(self.root, "slow_out")
        rc, doc, err = ctl(self.addr, "consolidate", self.slow_src, out, "--detach", *SLOW_ARGS)
        self.assertEqual(rc, 0, "%s %s" % (doc, err))
        job_id = doc["job_id"]

        # During the job: a scrape shows it running and bytes being written.
        deadline = time.monotonic() + 60
        running = throughput = None
        while time.monotonic() < deadline:
            running = self.value('reshard_jobs_running{job="reshard"}')
            throughput = self.value('sum(rate(reshard_written_bytes_total{job="reshard"}[5s]))')
            if running == 1 and throughput and throughput > 0:
                break
            rc, status, _ = ctl(self.addr, "status", job_id)
            self.assertNotIn(status["state"], ("failed", "cancelled"), status)
            if status["state"] == "succeeded":
                self.fail("the slow job finished before Prometheus saw it run (running %r, "
                          "throughput %r); it is too fast on this machine" % (running, throughput))
            time.sleep(0.25)
        self.assertEqual(running, 1)
        self.assertGreater(throughput, 0)
        self.figures = {"throughput_bytes_per_second_during_job": throughput}

        # After it: the histograms and counters moved by the job's own figures.
        deadline = time.monotonic() + 120
        while True:
            rc, status, _ = ctl(self.addr, "status", job_id)
            if status["state"] in ("succeeded", "failed", "cancelled"):
                break
            self.assertLess(time.monotonic(), deadline, "the slow job did not finish: %s" % status)
            time.sleep(0.2)
        self.assertEqual(status["state"], "succeeded", status)
        self.wait_value('sum(reshard_jobs_finished_total{job="reshard",kind="consolidate",'
                        'result="succeeded"})', lambda v: v == before["succeeded"] + 1,
                        "a scrape after the job")
        job = status["job"]
        duration = float(job["finished_unix"]) - float(job["started_unix"])
        after = {
            "written": self.scraped_total("reshard_written_bytes_total"),
            "read": self.scraped_total("reshard_read_bytes_total"),
            "tensors": self.scraped_total("reshard_tensors_written_total"),
            "files": self.scraped_total("reshard_files_written_total"),
            "count": self.scraped_total("reshard_job_duration_seconds_count", kind="consolidate"),
            "sum": self.scraped_total("reshard_job_duration_seconds_sum", kind="consolidate"),
            "plan": self.scraped_total("reshard_job_phase_duration_seconds_count", phase="plan"),
        }
        self.assertEqual(after["written"] - before["written"], status["bytes_written"])
        self.assertEqual(after["read"] - before["read"], status["bytes_read"])
        self.assertEqual(after["tensors"] - before["tensors"], status["tensors"])
        self.assertEqual(after["files"] - before["files"], len(status["files"]))
        self.assertEqual(after["count"] - before["count"], 1)
        self.assertAlmostEqual(after["sum"] - before["sum"], duration, delta=0.01)
        self.assertEqual(after["plan"] - before["plan"], 1)
        self.assertEqual(self.value('reshard_jobs_running{job="reshard"}'), 0)
        # The job's phases, as exported: the convert phase dominates an F32 -> BF16 job.
        phases = {}
        for r in self.query('reshard_job_phase_duration_seconds_sum{job="reshard"}')["result"]:
            phases[r["metric"]["phase"]] = float(r["value"][1])
        timings = job["timings"]
        self.assertAlmostEqual(phases["convert"], timings["convert_seconds"], delta=1e-6)
        self.assertAlmostEqual(phases["fsync"], timings["fsync_seconds"], delta=1e-6)
        self.assertGreater(phases["convert"], 0)
        self.assertGreater(phases["write"], 0)
        self.figures.update({
            "job_seconds": round(duration, 2), "bytes_read": status["bytes_read"],
            "bytes_written": status["bytes_written"], "tensors": status["tensors"],
            "files": len(status["files"]),
            "phases": {k: round(v, 3) for k, v in sorted(phases.items())},
            "peak_rss_bytes": int(job.get("peak_rss_bytes", 0)),
        })

        # More series with data: a small reshard-free job and a NotFound call (gRPC errors).
        rc, doc, err = ctl(self.addr, "consolidate", self.small_src,
                           os.path.join(self.root, "small_out"), "--no-progress")
        self.assertEqual(rc, 0, "%s %s" % (doc, err))
        rc, doc, _ = ctl(self.addr, "status", "j-doesnotexist")
        self.assertEqual(rc, 3, doc)
        self.wait_value('sum(grpc_server_handled_total{job="reshard",grpc_method="GetJob",'
                        'grpc_code="NotFound"})', lambda v: v >= 1, "the NotFound call scraped")
        self.wait_value('sum(reshard_jobs_finished_total{job="reshard",result="succeeded"})',
                        lambda v: v >= before["succeeded"] + 2, "the small job scraped")
        sys.stderr.write("observed: %s\n" % json.dumps(self.figures))

    def check_dashboard_queries(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        exprs = []

        def walk(items):
            for p in items:
                for t in p.get("targets", []):
                    exprs.append((p["title"], t["expr"]))
                walk(p.get("panels", []))

        walk(dash["panels"])
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                m = re.match(r"^label_values\((.*),\s*(\w+)\)$", q)
                self.assertIsNotNone(m, q)
                exprs.append(("variable " + v["name"], m.group(1)))
        self.assertGreaterEqual(len(exprs), 20)
        empty = []
        for title, expr in exprs:
            concrete = expr
            for var, value in GRAFANA_VARIABLES:
                concrete = concrete.replace(var, value)
            self.assertNotIn("$", concrete, "unknown Grafana variable in %r" % expr)
            if not self.query(concrete)["result"]:
                empty.append("%s: %s" % (title, concrete))
        self.assertEqual(empty, [], "dashboard queries without data")
        self.figures_dashboard = len(exprs)

    def check_alert_rules(self):
        import yaml  # Debian's python3-yaml; only this part needs it
        with open(ALERTS_YML) as f:
            rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        names = {r.get("alert") for r in rules}
        for needed in ("ReshardDaemonDown", "ReshardJobsFailing", "ReshardNoRecentSuccess",
                       "ReshardMemoryNearBudget", "ReshardQueueGrowing"):
            self.assertIn(needed, names)
        empty = []
        for rule in rules:
            self.query(rule["expr"])  # evaluates (usually to nothing: nothing is wrong)
            signal = insert_bool(rule["expr"])
            if not self.query(signal)["result"]:
                empty.append("%s: %s" % (rule.get("alert") or rule.get("record"), signal))
        self.assertEqual(empty, [], "alert expressions without data")
        # Prometheus evaluates the rule file itself: every rule healthy.
        deadline = time.monotonic() + 20
        while True:
            groups = json.loads(http_get(self.prom_url + "/api/v1/rules"))["data"]["groups"]
            loaded = [r for g in groups for r in g["rules"]]
            if len(loaded) == len(rules) and all(r["health"] == "ok" for r in loaded):
                break
            bad = [(r["name"], r["health"], r.get("lastError")) for r in loaded
                   if r["health"] != "ok"]
            self.assertFalse([b for b in bad if b[1] == "err"], bad)
            self.assertLess(time.monotonic(), deadline, "rules not evaluated: %s" % bad)
            time.sleep(0.5)
        firing = [r["name"] for r in loaded if r.get("state") == "firing"]
        self.assertEqual(firing, [], "alerts fire on a healthy daemon")
        sys.stderr.write("dashboard queries with data: %d; alert rules healthy: %d\n" %
                         (self.figures_dashboard, len(loaded)))


def main():
    global RESHARDD, RESHARDCTL
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--reshardd", required=True)
    parser.add_argument("--reshardctl", required=True)
    args, rest = parser.parse_known_args()
    RESHARDD = os.path.abspath(args.reshardd)
    RESHARDCTL = os.path.abspath(args.reshardctl)
    try:
        unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
    finally:
        cleanup()


if __name__ == "__main__":
    main()
