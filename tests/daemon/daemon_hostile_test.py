"""reshardd under hostile conditions (issue 10): a folder swapped for a symlink while a job runs,
FIFOs as inputs, a kill between publishing and recording success, and a kill loop.

Timing-dependent moments are made deterministic with the daemon's test-only fault points
(RESHARD_TEST_FAULTS, lib/core/test_faults.h): "before-publish=wait:PATH" holds every job with
its output complete in the staging folder until PATH exists; "after-publish=kill" SIGKILLs the
daemon right after the rename that publishes an output, before the job's success is recorded.

Run as tests/daemon/daemon_test.py is run (see daemon_harness.py), e.g.
    /usr/bin/python3 tests/daemon/daemon_hostile_test.py --reshardd bazel-bin/server/reshardd \
        --reshardctl bazel-bin/client/reshardctl --probe bazel-bin/tests/daemon/grpc_probe
"""

import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from daemon_harness import (MANIFEST, Daemon, DaemonTestCase, OwnDaemonsTestCase,  # noqa: E402
                            main, small_checkpoint, staging_path)

FAULTS = "RESHARD_TEST_FAULTS"


class HostilePathTests(DaemonTestCase):
    """One worker; every job waits before publishing until the class's `go` file exists."""

    @classmethod
    def setUpClass(cls):
        cls.go = os.path.join(tempfile.mkdtemp(prefix="reshardd-go-"), "go")
        open(cls.go, "w").close()  # jobs run freely unless a test removes it
        cls.DAEMON_ARGS = ("--max-concurrent-jobs", "1")
        super().setUpClass()
        cls.daemon.kill()
        cls.daemon = Daemon(cls.logs, os.path.join(cls.tmp, "state"), [cls.root],
                            cls.DAEMON_ARGS, env={FAULTS: "before-publish=wait:" + cls.go}).start()
        cls.src = small_checkpoint(os.path.join(cls.root, "src"))

    def tearDown(self):
        open(self.go, "w").close()
        super().tearDown()

    def hold_jobs(self):
        os.unlink(self.go)

    def release_jobs(self):
        open(self.go, "w").close()

    def wait_staged(self, out, timeout=60):
        """Until the job's output is complete in its staging folder (the manifest is last)."""
        manifest = os.path.join(staging_path(out), MANIFEST)
        deadline = time.monotonic() + timeout
        while not os.path.exists(manifest):
            if time.monotonic() > deadline:
                self.fail("no staged manifest at %s" % manifest)
            time.sleep(0.02)

    def test_parent_swapped_for_symlink_before_publish(self):
        # The defect: after the realpath checks, everything was done by path name, so the
        # publish followed the symlink and the cleanup deleted <outside>/.out.reshard-staging.
        parent = self.r("swap")
        os.makedirs(parent)
        out = os.path.join(parent, "out")
        victim = os.path.join(self.outside, ".out.reshard-staging")
        os.makedirs(victim)
        with open(os.path.join(victim, "precious"), "w") as f:
            f.write("keep")
        self.hold_jobs()
        job_id = self.submit(self.src, out)
        self.wait_staged(out)
        os.rename(parent, self.r("swap.moved"))
        os.symlink(self.outside, parent)
        self.release_jobs()
        doc = self.wait_terminal(job_id, timeout=60)
        self.assertEqual(doc["state"], "failed", doc)
        self.assertEqual(doc["job"]["error"]["code_name"], "PERMISSION_DENIED", doc)
        self.assertIn(parent, doc["job"]["error"]["message"])
        # Nothing outside the root was created, moved or deleted.
        self.assertEqual(sorted(os.listdir(self.outside)), [".out.reshard-staging"])
        self.assertEqual(os.listdir(victim), ["precious"])
        with open(os.path.join(victim, "precious")) as f:
            self.assertEqual(f.read(), "keep")
        # The job's own staging folder is gone from the folder it was made in.
        self.assertEqual(os.listdir(self.r("swap.moved")), [])

    def test_fifo_inputs_are_refused_everywhere(self):
        fifo = self.r("pipe.safetensors")
        os.mkfifo(fifo)
        folder = self.r("fifo_folder")
        os.makedirs(folder)
        os.mkfifo(os.path.join(folder, "model.safetensors"))
        # Inspect (several: each must return at once, none may hold a metadata-pool thread that
        # would make later calls time out), plan and submit: refused at once, naming the FIFO.
        for _ in range(4):
            for path in (fifo, folder):
                r = self.ctl("inspect", path, timeout=30)
                self.assertError(r, 3, "INVALID_ARGUMENT", "FIFO")
        r = self.ctl("plan", fifo, timeout=30)
        self.assertError(r, 3, "INVALID_ARGUMENT", "FIFO")
        r = self.ctl("consolidate", fifo, self.r("out_fifo"), "--detach", timeout=30)
        self.assertError(r, 3, "INVALID_ARGUMENT", "FIFO")
        self.assertNoOutput(self.r("out_fifo"))
        # The daemon still answers: a normal inspect works.
        started = time.monotonic()
        self.assertOk(self.ctl("inspect", self.src, timeout=30))
        self.assertLess(time.monotonic() - started, 10)

    def test_input_replaced_by_fifo_while_queued(self):
        # Accepted while a regular file; a FIFO by the time the job starts: the job fails with
        # a clear error instead of blocking its worker forever (cancel had no effect on that).
        single = self.r("single.safetensors")
        with open(os.path.join(self.src, sorted(os.listdir(self.src))[0]), "rb") as f:
            first_shard = f.read()
        with open(single, "wb") as f:
            f.write(first_shard)
        self.hold_jobs()
        blocker = self.submit(self.src, self.r("out_blocker"))
        queued = self.submit(single, self.r("out_fifo_late"))
        self.assertEqual(self.status(queued)["state"], "queued")
        os.unlink(single)
        os.mkfifo(single)
        self.release_jobs()
        self.assertEqual(self.wait_terminal(blocker, timeout=60)["state"], "succeeded")
        doc = self.wait_terminal(queued, timeout=60)
        self.assertEqual(doc["state"], "failed", doc)
        self.assertEqual(doc["job"]["error"]["code_name"], "INVALID_ARGUMENT", doc)
        self.assertIn("FIFO", doc["job"]["error"]["message"])
        self.assertNoOutput(self.r("out_fifo_late"))
        self.assertNoStaging(self.r("out_fifo_late"))

    def test_dangling_output_symlink_is_permission_denied(self):
        os.symlink(os.path.join(self.outside, "nowhere"), self.r("dangling_out"))
        r = self.ctl("consolidate", self.src, self.r("dangling_out"), "--detach")
        self.assertError(r, 3, "PERMISSION_DENIED")
        self.assertFalse(os.path.exists(os.path.join(self.outside, "nowhere")))

    def test_remote_url_output_is_refused(self):
        # This daemon has no s3:// root: an s3:// output is outside its roots; another scheme is
        # refused by name. Neither becomes a local path under the current folder.
        cwd = os.getcwd()
        os.chdir(self.root)
        try:
            r = self.ctl("consolidate", self.src, "s3://bucket/out", "--detach")
            other = self.ctl("consolidate", self.src, "gs://bucket/out", "--detach")
        finally:
            os.chdir(cwd)
        self.assertError(r, 3, "PERMISSION_DENIED", "s3://bucket/out")
        self.assertError(other, 3, "INVALID_ARGUMENT", "gs://bucket/out")
        self.assertFalse(os.path.exists(self.r("s3:")))
        self.assertFalse(os.path.exists(self.r("gs:")))


class PublishRecordTests(OwnDaemonsTestCase):
    """A daemon killed between publishing an output and recording the job's success."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = small_checkpoint(os.path.join(cls.root, "src"))

    def test_killed_after_publish_ends_succeeded(self):
        faulty = self.new_daemon(env={FAULTS: "after-publish=kill"})
        out = self.r("out_published")
        job_id = self.submit(self.src, out, "--idempotency-key", "wf-7", daemon=faulty)
        faulty.wait(timeout=60)
        self.assertEqual(faulty.proc.returncode, -signal.SIGKILL)
        # Published, not recorded: the output is complete under its final name.
        self.assertTrue(os.path.isfile(os.path.join(out, MANIFEST)))
        with open(os.path.join(out, MANIFEST)) as f:
            self.assertEqual(json.load(f)["job_id"], job_id)
        healthy = self.new_daemon(state=faulty.state_dir)
        doc = self.wait_terminal(job_id, daemon=healthy, timeout=60)
        self.assertEqual(doc["state"], "succeeded", doc)
        self.assertEqual(doc["job"]["attempts"], 2, doc)
        self.assertIn("published by attempt 1", doc["job"]["note"])
        self.assertOutputFilesMatch(out, doc)
        self.assertConsolidated(self.src, out)
        # The workflow's retry re-attaches to the succeeded job (exit 0).
        again = self.assertOk(self.ctl("consolidate", self.src, out, "--idempotency-key", "wf-7",
                                       daemon=healthy))
        self.assertEqual(again["job_id"], job_id)
        healthy.kill()


class StuckShutdownTests(OwnDaemonsTestCase):
    """SIGTERM stops the daemon within the grace plus the interrupt wait even when a job's
    worker cannot be interrupted (held by the test-only `block:` fault point)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = small_checkpoint(os.path.join(cls.root, "src"))

    def test_sigterm_with_a_stuck_job(self):
        never = os.path.join(self.tmp, "never-created")
        stuck = self.new_daemon(("--shutdown-grace", "1", "--shutdown-interrupt-wait", "1"),
                                env={FAULTS: "before-publish=block:" + never})
        out = self.r("out_stuck")
        job_id = self.submit(self.src, out, daemon=stuck)
        self.wait_for(job_id, lambda d: os.path.exists(os.path.join(staging_path(out), MANIFEST)),
                      "output staged", daemon=stuck)
        started = time.monotonic()
        stuck.signal(signal.SIGTERM)
        self.assertEqual(stuck.wait(timeout=30), 0)
        self.assertLess(time.monotonic() - started, 10, "reshardd took too long to stop")
        self.assertNoOutput(out)
        # The job resumes at the next start and completes.
        healthy = self.new_daemon(state=stuck.state_dir)
        doc = self.wait_terminal(job_id, daemon=healthy, timeout=60)
        self.assertEqual(doc["state"], "succeeded", doc)
        self.assertConsolidated(self.src, out)
        healthy.kill()


class KillLoopTests(OwnDaemonsTestCase):
    """20 cycles of: start the daemon, submit 20 jobs, SIGKILL it at a random moment. Then every
    job must end SUCCEEDED with an output equal to its source."""

    CYCLES = 20
    JOBS_PER_CYCLE = 20

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sources = [small_checkpoint(os.path.join(cls.root, "src%d" % i), seed=i)
                       for i in range(2)]

    def test_kill_loop(self):
        rng = random.Random(int(os.environ.get("RESHARD_KILL_LOOP_SEED", "20261123")))
        state = tempfile.mkdtemp(prefix="state-", dir=self.tmp)
        # Attempts are not the point here: a job may be interrupted in many cycles.
        d = Daemon(self.logs, state, [self.root], ("--max-attempts", "1000"))
        self.extra_daemons.append(d)
        jobs = {}  # key -> (source, output, job id or None)
        for cycle in range(self.CYCLES):
            d.start()
            for i in range(self.JOBS_PER_CYCLE):
                key = "loop-%d-%d" % (cycle, i)
                jobs[key] = (self.sources[i % 2], self.r("out", "c%02d-%02d" % (cycle, i)), None)
            killer = threading.Timer(rng.uniform(0.0, 1.5), d.signal, (signal.SIGKILL,))
            killer.start()
            # Submit (or re-attach, same key) every job not yet known to have an id.
            for key, (src, out, job_id) in sorted(jobs.items()):
                if job_id is not None or not d.alive():
                    continue
                r = self.ctl("consolidate", src, out, "--detach", "--idempotency-key", key,
                             daemon=d, timeout=60)
                if r.rc == 0 and r.doc:
                    jobs[key] = (src, out, r.doc["job_id"])
                else:
                    # The daemon died under the call: exit 7; the job may or may not exist.
                    self.assertIn(r.rc, (7,), repr(r))
            killer.join()
            d.signal(signal.SIGKILL)
            d.wait(timeout=30)
            # Never a partial output under a final name.
            for src, out, _ in jobs.values():
                if os.path.exists(out):
                    self.assertTrue(os.path.isfile(os.path.join(out, MANIFEST)),
                                    "partial output %s: %s" % (out, os.listdir(out)))
        d.start()
        for key, (src, out, job_id) in sorted(jobs.items()):
            if job_id is None:
                r = self.assertOk(self.ctl("consolidate", src, out, "--detach",
                                           "--idempotency-key", key, daemon=d))
                jobs[key] = (src, out, r["job_id"])
        states, interrupted = {}, 0
        for key, (src, out, job_id) in sorted(jobs.items()):
            doc = self.wait_terminal(job_id, daemon=d, timeout=300)
            states[doc["state"]] = states.get(doc["state"], 0) + 1
            interrupted += int(doc["job"].get("attempts", 0)) > 1
            self.assertEqual(doc["state"], "succeeded", doc)
            self.assertOutputFilesMatch(out, doc)
            self.assertConsolidated(src, out)
        sys.stderr.write("kill loop: %d cycles x %d jobs; %d jobs were interrupted while running "
                         "and resumed; final states %s\n" % (self.CYCLES, self.JOBS_PER_CYCLE,
                                                               interrupted, states))
        self.assertGreater(interrupted, 0, "no kill landed on a running job; the loop tests "
                           "nothing")
        self.assertEqual(states, {"succeeded": self.CYCLES * self.JOBS_PER_CYCLE})


if __name__ == "__main__":
    main()
