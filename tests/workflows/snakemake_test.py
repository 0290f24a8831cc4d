"""A real workflow engine driving reshardd: Snakemake 7.21 runs tests/workflows/Snakefile.

The Snakefile's rules call `reshardctl --server ADDR ... --result-file`: `consolidate` writes a
bf16 model and its JSON result, `reshard` checks that result and splits the model it names into
2 tensor-parallel parts, `verify` compares the two. The test starts a real reshardd on ephemeral
loopback ports (tests/daemon/daemon_harness.py), runs `snakemake --cores 2`, and checks every
output element by element with tests/st_reference.py against the source checkpoint written by
tools/bench/make_checkpoint.py.

Run (from the repository root):

    bazel build //server:reshardd //client:reshardctl
    /usr/bin/python3 tests/workflows/snakemake_test.py --reshardd bazel-bin/server/reshardd \
        --reshardctl bazel-bin/client/reshardctl --snakefile tests/workflows/Snakefile

or `bazel test //tests/workflows:snakemake_test`.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True


def _source(rel):
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, "reshard", rel)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", rel)


sys.path.insert(0, os.path.dirname(_source("tests/daemon/daemon_harness.py")))
import daemon_harness as dh  # noqa: E402
from daemon_harness import R, RULES, DaemonTestCase, make_checkpoint, tail  # noqa: E402

SNAKEFILE = None
SNAKEMAKE = shutil.which("snakemake", path="/usr/bin:/bin") or "/usr/bin/snakemake"


class SnakemakeTests(DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Even vocabulary and sizes: splits into 2 parts.
        cls.src = make_checkpoint(os.path.join(cls.root, "ckpt"), "4MiB", "1MB", "--hidden",
                                  "128", "--layers", "2", "--vocab", "1024")
        cls.rules = os.path.join(cls.tmp, "rules.json")
        with open(cls.rules, "w") as f:
            json.dump(RULES, f)
        cls.home = os.path.join(cls.tmp, "home")
        os.makedirs(cls.home)

    def snakemake(self, workdir, checkpoint, *extra):
        cmd = [SNAKEMAKE, "--snakefile", SNAKEFILE, "--directory", workdir, "--cores", "2",
               "--nocolor", "--config", "reshardctl=" + dh.RESHARDCTL,
               "server=" + self.daemon.addr, "checkpoint=" + checkpoint,
               "rules=" + self.rules] + list(extra)
        env = {k: v for k, v in os.environ.items() if k not in dh.SCRUBBED_ENV}
        # Snakemake keeps caches under $HOME and XDG folders: the test's own.
        env.update(HOME=self.home, XDG_CACHE_HOME=os.path.join(self.home, ".cache"),
                   PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           stdin=subprocess.DEVNULL, env=env, timeout=600)
        return r.returncode, r.stdout

    def jobs(self):
        return self.assertOk(self.ctl("list", "--limit", "1000"))["jobs"]

    def test_consolidate_then_reshard_then_verify(self):
        wf = self.r("wf")
        before = len(self.jobs())
        rc, log = self.snakemake(wf, self.src)
        self.assertEqual(rc, 0, tail(log, 6000))
        for rule in ("consolidate", "reshard", "verify"):
            self.assertRegex(log, r"rule %s:" % rule, tail(log, 6000))
        # Step 1: the daemon consolidated to bf16; the JSON result describes it.
        hf = os.path.join(wf, "hf")
        with open(os.path.join(wf, "consolidate.json")) as f:
            first = json.load(f)
        self.assertIs(first["ok"], True, first)
        self.assertEqual(first["state"], "succeeded")
        self.assertEqual(first["output"], os.path.realpath(hf))
        self.assertEqual(first["job"]["spec"]["dtype"], "DTYPE_BF16")
        self.assertOutputFilesMatch(hf, first)
        self.assertConsolidated(self.src, hf, dtype="bf16")
        # Step 2: the model named by that result, split into 2 parts by the daemon.
        tp2 = os.path.join(wf, "tp2")
        with open(os.path.join(wf, "reshard.json")) as f:
            second = json.load(f)
        self.assertIs(second["ok"], True, second)
        self.assertEqual(second["kind"], "reshard")
        self.assertEqual(second["input"], first["output"])
        self.assertOutputFilesMatch(tp2, second)
        expected = R.split_model({n: R.convert(t, "bf16")
                                  for n, t in R.read_folder(self.src).items()}, RULES, 2)
        actual = R.read_parts(tp2)
        self.assertEqual(len(actual), 2)
        for i, (exp, act) in enumerate(zip(expected, actual)):
            self.assertEqual(sorted(act), sorted(exp), "part %d" % i)
            for name in exp:
                diff = R.diff_tensors(exp[name], act[name])
                self.assertIsNone(diff, "part %d %s: %s" % (i, name, diff))
        # Step 3: reshardctl verify found them equal.
        with open(os.path.join(wf, "verify.json")) as f:
            third = json.load(f)
        self.assertIs(third["equal"], True, third)
        self.assertGreater(third["tensors_compared"], 0)
        # Both conversions went through the daemon, as two succeeded jobs.
        jobs = self.jobs()
        self.assertEqual(len(jobs), before + 2)
        ids = {first["job_id"], second["job_id"]}
        self.assertEqual({j["job_id"] for j in jobs[:2]}, ids)
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs[:2]))

        # A second run has nothing to do and submits nothing.
        rc, log = self.snakemake(wf, self.src)
        self.assertEqual(rc, 0, tail(log, 6000))
        self.assertIn("Nothing to be done", log)
        self.assertEqual(len(self.jobs()), before + 2)

        # Forcing the first step again: Snakemake removes its outputs, the daemon converts
        # anew (two new jobs) and the steps after it run on the new model.
        rc, log = self.snakemake(wf, self.src, "--forcerun", "consolidate")
        self.assertEqual(rc, 0, tail(log, 6000))
        jobs = self.jobs()
        self.assertEqual(len(jobs), before + 4)
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs[:2]))
        self.assertNotIn(jobs[0]["job_id"], ids)
        with open(os.path.join(wf, "verify.json")) as f:
            self.assertIs(json.load(f)["equal"], True)
        self.assertConsolidated(self.src, hf, dtype="bf16")

        # The reshard step really reads the JSON result: one that disagrees with the files on
        # disk stops it before it submits anything.
        result = os.path.join(wf, "consolidate.json")
        with open(result) as f:
            doc = json.load(f)
        doc["files"][0]["bytes"] = int(doc["files"][0]["bytes"]) + 1
        with open(result, "w") as f:
            json.dump(doc, f)
        rc, log = self.snakemake(wf, self.src)
        self.assertNotEqual(rc, 0, tail(log, 6000))
        self.assertRegex(log, r"Error in rule reshard", tail(log, 6000))
        self.assertIn("the result says", log)
        self.assertEqual(len(self.jobs()), before + 4)
        self.assertFalse(os.path.exists(os.path.join(wf, "tp2")))

    def test_failed_step_stops_the_workflow(self):
        # A checkpoint with a truncated shard: the consolidate job fails in the daemon, reshardctl
        # exits 3, Snakemake stops and the rules after it never run.
        bad = self.r("bad_ckpt")
        shutil.copytree(self.src, bad)
        victim = os.path.join(bad, R.list_safetensors(bad)[1])
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
        wf = self.r("wf_bad")
        before = len(self.jobs())
        rc, log = self.snakemake(wf, bad)
        self.assertNotEqual(rc, 0, tail(log, 6000))
        self.assertRegex(log, r"Error in rule consolidate", tail(log, 6000))
        self.assertIn("(the file is truncated)", log)  # reshardctl's message, on stderr
        for name in ("hf", "tp2", "reshard.json", "verify.json"):
            self.assertFalse(os.path.exists(os.path.join(wf, name)), name)
        self.assertNoStaging(os.path.join(wf, "hf"))
        jobs = self.jobs()
        self.assertEqual(len(jobs), before + 1, "only the consolidate job was submitted")
        self.assertEqual(jobs[0]["state"], "failed", jobs[0])
        self.assertIn(os.path.basename(victim), jobs[0]["job"]["error"]["message"])


def main():
    global SNAKEFILE
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--snakefile", required=True)
    args, rest = parser.parse_known_args()
    SNAKEFILE = os.path.abspath(args.snakefile)
    sys.argv = [sys.argv[0]] + rest
    dh.main()


if __name__ == "__main__":
    main()
