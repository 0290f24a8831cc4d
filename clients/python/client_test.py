"""Tests of the Python client (clients/python/src/reshard_client.py) against a real reshardd.

Run (from the repository root):

    bazel build //clients/python:reshard_client //server:reshardd //client:reshardctl
    PYTHONPATH=bazel-bin/clients/python /usr/bin/python3 clients/python/client_test.py \
        --reshardd bazel-bin/server/reshardd --reshardctl bazel-bin/client/reshardctl

or `bazel test //clients/python:client_test`. One daemon on ephemeral loopback ports
(tests/daemon/daemon_harness.py) with one job slot and the daemon's test-only fault point that
holds finished jobs before publishing while the `go` file is absent (RESHARD_TEST_FAULTS), so
running and queued jobs can be observed and cancelled without big checkpoints. Outputs are
checked element by element with tests/st_reference.py against checkpoints written by
tools/bench/make_checkpoint.py.
"""

import json
import os
import sys
import time

import numpy as np


def _runfiles_path(rel):
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, "reshard", rel)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", rel)


sys.dont_write_bytecode = True
# Under `bazel test` the generated stubs and the module sit in the runfiles' clients/python;
# by hand, PYTHONPATH=bazel-bin/clients/python.
sys.path.insert(0, _runfiles_path("clients/python"))
sys.path.insert(0, os.path.dirname(_runfiles_path("tests/daemon/daemon_harness.py")))
import daemon_harness as dh  # noqa: E402
from daemon_harness import (R, RULES, Daemon, DaemonTestCase, make_checkpoint,  # noqa: E402
                            small_checkpoint)

import reshard_client  # noqa: E402
from reshard_client import Client, JobFailedError, ReshardError  # noqa: E402
from daemon_auth_test import make_pki, token_entry  # noqa: E402


class ClientTests(DaemonTestCase):

    DAEMON_ARGS = ("--max-concurrent-jobs", "1")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.go = os.path.join(cls.tmp, "go")  # removed with the class's temp folder
        open(cls.go, "w").close()
        cls.daemon.kill()
        cls.daemon = Daemon(cls.logs, os.path.join(cls.tmp, "state"), [cls.root],
                            cls.DAEMON_ARGS,
                            env={"RESHARD_TEST_FAULTS": "before-publish=wait:" + cls.go}).start()
        cls.src = make_checkpoint(os.path.join(cls.root, "src"), "8MiB", "2MB")
        # Even vocabulary and sizes: splits into 2 parts.
        cls.rsrc = make_checkpoint(os.path.join(cls.root, "rsrc"), "4MiB", "1MB", "--hidden",
                                   "128", "--layers", "2", "--vocab", "1024")
        cls.small = small_checkpoint(os.path.join(cls.root, "small"))
        cls.rules_file = os.path.join(cls.tmp, "rules.json")
        with open(cls.rules_file, "w") as f:
            json.dump(RULES, f)
        cls.client = Client(cls.daemon.addr)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def tearDown(self):
        open(self.go, "w").close()
        super().tearDown()

    def hold(self):
        """Jobs that finish writing now wait before publishing until release()."""
        if os.path.exists(self.go):
            os.unlink(self.go)

    def release(self):
        open(self.go, "w").close()

    def assertFilesOnDisk(self, job):
        self.assertTrue(job.output_files, job)
        for f in job.output_files:
            path = os.path.join(job.output, f.name)
            self.assertTrue(os.path.isfile(path), path)
            self.assertEqual(os.path.getsize(path), f.bytes, path)
            self.assertEqual(dh.xxh3_64_file(path), f.xxh3_64, path)

    def running_with_progress(self, job_id):
        """Watches until the job runs with all bytes written (held before publishing)."""
        for job in self.client.watch(job_id, timeout=120):
            self.assertFalse(job.done, "job ended while held: %r" % (job,))
            if job.state == "RUNNING" and job.progress.bytes_total and \
                    job.progress.bytes_done == job.progress.bytes_total:
                return job
        self.fail("watch ended before the job ran")

    # -- consolidate / reshard ------------------------------------------------------------------

    def test_consolidate_and_wait(self):
        out = self.r("out_wait")
        job_id = self.client.consolidate(self.src, out, max_shard_size="3MB", threads=2)
        self.assertRegex(job_id, r"^\S+$")
        job = self.client.wait(job_id, timeout=120)
        self.assertIsInstance(job, reshard_client.Job)
        self.assertEqual(job.state, "SUCCEEDED")
        self.assertTrue(job.ok and job.done)
        self.assertEqual(job.id, job_id)
        self.assertEqual(job.kind, "CONSOLIDATE")
        self.assertEqual(job.input, os.path.realpath(self.src))
        self.assertEqual(job.output, os.path.realpath(out))
        self.assertEqual(job.spec["max_shard_size"], "3000000")  # proto JSON: uint64 as text
        self.assertEqual(job.spec["threads"], 2)
        self.assertIsNone(job.error)
        self.assertEqual(job.attempts, 1)
        self.assertEqual(job.progress.bytes_done, job.progress.bytes_total)
        self.assertEqual(job.progress.fraction, 1.0)
        self.assertGreater(job.bytes_written, 8 << 20)
        self.assertGreaterEqual(job.finished_unix, job.started_unix)
        self.assertGreater(job.started_unix, 0)
        self.assertGreater(job.timings["write"], 0)
        self.assertEqual(job.to_dict()["id"], job_id)
        self.assertFilesOnDisk(job)
        shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        self.assertEqual(sorted(shards),
                         sorted(f.name for f in job.output_files if f.name in shards))
        self.assertConsolidated(self.src, out)
        # get() sees the same finished job; reshardctl agrees on the outcome.
        again = self.client.get(job_id)
        self.assertEqual(again.state, "SUCCEEDED")
        self.assertEqual(again.output_files, job.output_files)
        status = self.assertOk(self.ctl("status", job_id))
        self.assertEqual(status["state"], "succeeded")

    def test_dtype_bf16(self):
        out = self.r("out_bf16")
        job = self.client.wait(self.client.consolidate(self.src, out, dtype="bf16"))
        self.assertEqual(job.spec["dtype"], "DTYPE_BF16")
        self.assertConsolidated(self.src, out, dtype="bf16")
        # The enum name works too; and fp16 really converts (not silently kept).
        out16 = self.r("out_fp16")
        job16 = self.client.wait(self.client.consolidate(self.src, out16, dtype="DTYPE_FP16"))
        self.assertEqual(job16.spec["dtype"], "DTYPE_FP16")
        self.assertConsolidated(self.src, out16, dtype="fp16")

    def test_reshard_with_rules_dict_text_and_file(self):
        source = R.read_folder(self.rsrc)
        expected = R.split_model(source, RULES, 2)
        for how, rules in (("dict", RULES), ("text", json.dumps(RULES)),
                           ("file", self.rules_file)):
            out = self.r("out_parts_" + how)
            job = self.client.wait(self.client.reshard(self.rsrc, out, 2, rules), timeout=120)
            self.assertEqual(job.kind, "RESHARD", how)
            self.assertEqual(job.spec["parts"], 2)
            self.assertFilesOnDisk(job)
            self.assertEqual(R.list_safetensors(out),
                             ["model_part-%d.safetensors" % i for i in range(2)])
            actual = R.read_parts(out)
            self.assertEqual(len(actual), 2)
            for i, (exp, act) in enumerate(zip(expected, actual)):
                self.assertEqual(sorted(act), sorted(exp), "%s part %d" % (how, i))
                for name in exp:
                    diff = R.diff_tensors(exp[name], act[name])
                    self.assertIsNone(diff, "%s part %d %s: %s" % (how, i, name, diff))
        # The parts merge back with the rules (consolidate's `rules`) into the original model.
        back = self.r("out_merged")
        self.client.wait(self.client.consolidate(self.r("out_parts_dict"), back, rules=RULES))
        self.assertConsolidated(self.rsrc, back)
        # Rules that are not JSON are refused before anything is sent.
        with self.assertRaises(ValueError):
            self.client.reshard(self.rsrc, self.r("out_bad_rules"), 2, "{not json")
        with self.assertRaises(FileNotFoundError):
            self.client.reshard(self.rsrc, self.r("out_bad_rules"), 2, self.r("no-rules.json"))
        with self.assertRaises(ValueError):
            self.client.reshard(self.rsrc, self.r("out_bad_rules"), 0, RULES)

    # -- failures -------------------------------------------------------------------------------

    def test_failed_job_raises_with_code(self):
        # A shard whose data ends early: the header promises more bytes than the file holds.
        bad = self.r("bad")
        os.makedirs(bad)
        victim = R.list_safetensors(self.small)[1]
        for name in os.listdir(self.small):
            with open(os.path.join(self.small, name), "rb") as f:
                data = f.read()
            if name == victim:
                data = data[:len(data) // 2]
            with open(os.path.join(bad, name), "wb") as f:
                f.write(data)
        out = self.r("out_bad")
        try:
            job_id = self.client.consolidate(bad, out)
        except ReshardError as e:  # refused at submit: still a code and a message
            self.fail("the daemon refused at submit, expected a failed job: %s" % e)
        with self.assertRaises(JobFailedError) as cm:
            self.client.wait(job_id, timeout=120)
        e = cm.exception
        self.assertIsInstance(e, ReshardError)
        # The file is shorter than its header says: corrupt data.
        self.assertEqual(e.code, "DATA_LOSS", e)
        self.assertEqual(e.code_value, reshard_client._code_value(e.code))
        self.assertIn(victim, e.message)
        self.assertEqual(e.exit_code, 3)
        self.assertEqual(e.job.state, "FAILED")
        self.assertEqual(e.job_id, job_id)
        self.assertEqual(e.job.error.code, e.code)
        self.assertIn(e.code, str(e))
        # check=False hands the failed job back instead.
        job = self.client.wait(job_id, check=False)
        self.assertEqual(job.state, "FAILED")
        self.assertEqual(job.error.message, e.message)
        self.assertNoOutput(out)
        self.assertNoStaging(out)

    def test_flag_refused_once_the_input_is_read_exits_2(self):
        # hf_family for a Megatron input written as megatron: refused when the job plans, a
        # usage error as reshardctl's in-process refusal (exit 2).
        sys.path.insert(0, _runfiles_path("tests/fixtures"))
        import hf_megatron_fixture as hmf
        spec = hmf.Spec("llama", groups=2)
        folder = hmf.write_megatron_lm(self.r("mlm"), spec, hmf.hf_state_dict(spec), 1, 1)
        out = self.r("out_family")
        job_id = self.client.reshard(folder, out, 1, output_format="megatron", hf_family="llama")
        with self.assertRaises(JobFailedError) as cm:
            self.client.wait(job_id, timeout=120)
        e = cm.exception
        self.assertEqual((e.code, e.exit_code, e.job.error.usage_error),
                         ("INVALID_ARGUMENT", 2, True))
        expected_message = (
            "%s: --family is only for --format hf (a Hugging Face model written from a "
            "Megatron checkpoint) and for a Hugging Face model imported with --format megatron "
            "or megatron-torch-dist; the input is megatron, not a Hugging Face model folder"
            % folder)
        self.assertEqual(e.message, expected_message)
        self.assertNoOutput(out)
        # A dry run finds it the same way: the refused Plan call is a usage error too.
        with self.assertRaises(ReshardError) as cm:
            self.client.plan(folder, parts=1, output_format="megatron", hf_family="llama")
        e = cm.exception
        self.assertEqual((e.code, e.exit_code, e.message),
                         ("INVALID_ARGUMENT", 2, expected_message))
        self.assertIs(e.usage_error, True)

    def test_option_refused_at_submit_exits_2(self):
        # hf_family for a safetensors output: the daemon refuses the submit itself; a usage
        # error (exit 2), as reshardctl refuses --family there.
        out = self.r("out_family_submit")
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.small, out, hf_family="llama")
        e = cm.exception
        self.assertNotIsInstance(e, JobFailedError)
        self.assertEqual((e.code, e.exit_code, e.job), ("INVALID_ARGUMENT", 2, None))
        self.assertIs(e.usage_error, True)
        self.assertEqual(e.message,
                         "spec.hf_family is only for spec.output_format hf (a Hugging Face "
                         "model written from a Megatron checkpoint) and for a Hugging Face model "
                         "imported with spec.output_format megatron or megatron-torch-dist; not "
                         "for output format safetensors")
        with self.assertRaises(ReshardError) as cm:
            self.client.plan(self.small, hf_family="llama")
        self.assertEqual((cm.exception.exit_code, cm.exception.message), (2, e.message))
        # Another INVALID_ARGUMENT refusal of the request is not a usage error: exit 3.
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.small, os.path.join(self.small, "out"))
        e = cm.exception
        self.assertEqual((e.code, e.exit_code, e.usage_error, e.message),
                         ("INVALID_ARGUMENT", 3, False,
                          "spec.output must not be, contain or lie inside the input"))
        self.assertNoOutput(out)
        self.assertNoOutput(os.path.join(self.small, "out"))

    def test_refused_calls_raise_with_code(self):
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.src, os.path.join(self.outside, "out"))
        self.assertEqual(cm.exception.code, "PERMISSION_DENIED")
        self.assertEqual(cm.exception.code_value, 7)
        self.assertEqual(cm.exception.exit_code, 3)
        self.assertNotIsInstance(cm.exception, JobFailedError)
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.r("missing"), self.r("out_missing"))
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        with self.assertRaises(ReshardError) as cm:
            self.client.get("no-such-job")
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        with self.assertRaises(ReshardError) as cm:
            self.client.wait("no-such-job", timeout=10)
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        # A non-empty output is refused unless overwrite=True.
        out = self.r("out_full")
        os.makedirs(out)
        with open(os.path.join(out, "keep.txt"), "w") as f:
            f.write("x")
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.small, out)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        job = self.client.wait(self.client.consolidate(self.small, out, overwrite=True))
        self.assertEqual(job.spec["overwrite"], True)
        self.assertConsolidated(self.small, out)

    def test_unreachable_daemon(self):
        port = dh.free_closed_port()
        with Client("127.0.0.1:%d" % port, max_attempts=2, initial_backoff=0.05,
                    rpc_timeout=5) as c:
            t0 = time.monotonic()
            with self.assertRaises(ReshardError) as cm:
                c.list()
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            self.assertEqual(cm.exception.exit_code, 7)
            self.assertIn("127.0.0.1:%d" % port, cm.exception.message)
            self.assertLess(time.monotonic() - t0, 15)

    def test_tls_client_refuses_a_plaintext_daemon(self):
        # The client really speaks TLS when given a CA: the plaintext daemon's port fails the
        # handshake (UNAVAILABLE) instead of answering.
        with Client(self.daemon.addr, tls=True, max_attempts=1, rpc_timeout=5) as c:
            self.assertTrue(c.tls)
            with self.assertRaises(ReshardError) as cm:
                c.list(limit=1)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
        with self.assertRaises(ValueError):
            Client(self.daemon.addr, tls_cert=b"PEM")  # a certificate without its key
        self.assertEqual(reshard_client._read_pem("-----BEGIN CERTIFICATE-----\nx\n"),
                         b"-----BEGIN CERTIFICATE-----\nx\n")

    def test_token_is_sent_and_harmless_without_auth(self):
        # This daemon has no --auth-tokens: the metadata is ignored and calls succeed.
        with Client(self.daemon.addr, token="s3cret-token") as c:
            self.assertEqual(c._metadata, (("authorization", "Bearer s3cret-token"),))
            self.assertIsInstance(c.list(limit=1), list)
            self.assertNotIn("s3cret", repr(c))
        token_file = os.path.join(self.tmp, "token")
        with open(token_file, "w") as f:
            f.write("from-file\n")
        with Client(self.daemon.addr, token_file=token_file) as c:
            self.assertEqual(c._metadata, (("authorization", "Bearer from-file"),))
        with self.assertRaises(ValueError):
            Client(self.daemon.addr, token="two\nlines")

    # -- cancel / list / watch ------------------------------------------------------------------

    def test_cancel_running_and_queued(self):
        self.hold()
        out_running = self.r("out_cancel_running")
        running = self.client.consolidate(self.small, out_running)
        self.running_with_progress(running)
        out_queued = self.r("out_cancel_queued")
        queued = self.client.consolidate(self.small, out_queued)
        self.assertEqual(self.client.get(queued).state, "QUEUED")  # one slot, held
        job = self.client.cancel(queued)
        self.assertEqual(job.state, "CANCELLED")  # a queued job is cancelled at once
        self.assertEqual(job.error.code, "CANCELLED")
        self.client.cancel(running)
        with self.assertRaises(JobFailedError) as cm:
            self.client.wait(running, timeout=60)
        self.assertEqual(cm.exception.code, "CANCELLED")
        self.assertEqual(cm.exception.exit_code, 5)
        self.assertEqual(cm.exception.job.state, "CANCELLED")
        for out in (out_running, out_queued):
            self.assertNoOutput(out)
            self.assertNoStaging(out)
        # Cancelling a finished job returns it unchanged.
        self.assertEqual(self.client.cancel(running).state, "CANCELLED")
        cancelled = [j.id for j in self.client.list(state="cancelled")]
        self.assertIn(running, cancelled)
        self.assertIn(queued, cancelled)

    def test_list(self):
        a = self.client.consolidate(self.small, self.r("out_list_a"))
        self.client.wait(a)
        b = self.client.consolidate(self.small, self.r("out_list_b"))
        self.client.wait(b)
        jobs = self.client.list()
        ids = [j.id for j in jobs]
        self.assertIn(a, ids)
        self.assertIn(b, ids)
        self.assertLess(ids.index(b), ids.index(a), "newest first")
        self.assertEqual([j.id for j in self.client.list(limit=1)], [b])
        succeeded = self.client.list(state="SUCCEEDED", limit=None)
        self.assertTrue(succeeded)
        self.assertTrue(all(j.state == "SUCCEEDED" for j in succeeded))
        self.assertIn(a, [j.id for j in succeeded])
        for state in ("queued", "running", "failed", "cancelled"):
            self.assertNotIn(a, [j.id for j in self.client.list(state=state)], state)
        both = self.client.list(state=["succeeded", "JOB_STATE_FAILED"])
        self.assertIn(a, [j.id for j in both])
        # Pages of 1 job: limit=2 fetches two pages and follows next_page_token.
        total = len(self.client.list(limit=None))
        self.assertGreaterEqual(total, 2)
        self.assertEqual([j.id for j in self.client.list(limit=2)][:2], ids[:2])
        with self.assertRaises(ValueError):
            self.client.list(state="finished")
        with self.assertRaises(ValueError):
            self.client.list(limit=0)

    def test_watch_yields_progress(self):
        self.hold()
        out = self.r("out_watch")
        job_id = self.client.consolidate(self.src, out, threads=1)
        events = []
        for job in self.client.watch(job_id, timeout=120):
            events.append(job)
            if job.state == "RUNNING" and job.progress.bytes_done == job.progress.bytes_total > 0:
                self.release()  # held before publishing with every byte written: let it go
        self.assertTrue(events)
        states = [j.state for j in events]
        self.assertEqual(states[-1], "SUCCEEDED", states)
        self.assertIn("RUNNING", states)
        self.assertEqual(states.count("SUCCEEDED"), 1)
        running = [j for j in events if j.state == "RUNNING"]
        done = [j.progress.bytes_done for j in running]
        self.assertEqual(done, sorted(done), "progress goes forward")
        self.assertTrue(any(j.progress.bytes_total > 0 for j in running), running)
        # Held before publishing: a RUNNING event with every byte written.
        self.assertTrue(any(j.progress.bytes_done == j.progress.bytes_total > 0 and
                            j.progress.files_done == j.progress.files_total for j in running),
                        [j.progress for j in running])
        self.assertConsolidated(self.src, out)
        # Watching a finished job yields its final state once.
        self.assertEqual([j.state for j in self.client.watch(job_id)], ["SUCCEEDED"])

    def test_wait_timeout_and_breaking_out_of_watch(self):
        self.hold()
        job_id = self.client.consolidate(self.small, self.r("out_timeout"))
        self.running_with_progress(job_id)  # leaves the watch loop early: the stream ends
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):
            self.client.wait(job_id, timeout=0.5)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(self.client.get(job_id).state, "RUNNING")  # the job goes on
        self.release()
        self.assertEqual(self.client.wait(job_id, timeout=60).state, "SUCCEEDED")

    # -- idempotency ----------------------------------------------------------------------------

    def test_idempotency_key_reattaches(self):
        self.hold()
        out = self.r("out_idem")
        first = self.client.consolidate(self.small, out, dtype="bf16", idempotency_key="run7-hf")
        second = self.client.consolidate(self.small, out, dtype="bf16", idempotency_key="run7-hf")
        self.assertEqual(first, second)
        # The same key with another spec is refused.
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.small, out, dtype="fp16", idempotency_key="run7-hf")
        self.assertEqual(cm.exception.code, "ALREADY_EXISTS")
        self.release()
        job = self.client.wait(first, timeout=60)
        self.assertEqual(job.idempotency_key, "run7-hf")
        # After success, a resubmit (a retried workflow step) re-attaches to the finished job
        # instead of failing on the now non-empty output.
        third = self.client.consolidate(self.small, out, dtype="bf16", idempotency_key="run7-hf")
        self.assertEqual(third, first)
        self.assertEqual(self.client.wait(third).output_files, job.output_files)
        self.assertEqual(len([j for j in self.client.list(limit=None)
                              if j.idempotency_key == "run7-hf"]), 1)
        self.assertConsolidated(self.small, out, dtype="bf16")
        # Without a key every submit is a new job.
        a = self.client.consolidate(self.small, self.r("out_nokey"))
        self.client.wait(a)
        with self.assertRaises(ReshardError) as cm:
            self.client.consolidate(self.small, self.r("out_nokey"))
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")

    # -- options --------------------------------------------------------------------------------

    def test_unknown_and_bad_options(self):
        with self.assertRaises(TypeError) as cm:
            self.client.consolidate(self.small, self.r("out_typo"), dtpye="bf16", shards=3)
        self.assertIn("'dtpye'", str(cm.exception))
        self.assertIn("'shards'", str(cm.exception))
        self.assertIn("consolidate()", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            self.client.reshard(self.rsrc, self.r("out_typo"), 2, RULES, kind=1)
        self.assertIn("'kind'", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            self.client.plan(self.small, idempotency_key="x")
        self.assertNotIn("idempotency_key", str(cm.exception).split("options are")[1])
        with self.assertRaises(ValueError):
            self.client.consolidate(self.small, self.r("out_typo"), dtype="int4")
        with self.assertRaises(ValueError):
            self.client.consolidate(self.small, self.r("out_typo"), max_shard_size="5 parsecs")
        with self.assertRaises(TypeError):
            self.client.consolidate(self.small, self.r("out_typo"), overwrite="yes")
        with self.assertRaises(TypeError):
            self.client.consolidate(self.small, self.r("out_typo"), threads="2")
        self.assertNoOutput(self.r("out_typo"))
        # Every JobSpec field but the positional ones is an option.
        self.assertIn("partition_index", Client.OPTIONS)
        self.assertIn("window_bytes", Client.OPTIONS)
        self.assertNotIn("input", Client.OPTIONS)
        self.assertEqual(reshard_client.parse_size("5GB"), 5 * 10**9)
        self.assertEqual(reshard_client.parse_size("2GiB"), 2 << 30)
        self.assertEqual(reshard_client.parse_size(123), 123)

    def test_options_reach_the_job(self):
        out = self.r("out_opts")
        job_id = self.client.consolidate(
            self.small, out, output_format="safetensors", priority=5, threads=1,
            window_bytes="1MiB", io="buffered", memory_budget="64MiB", duplicate_tied=True,
            skip_crc_check=True, max_shard_size=None)
        job = self.client.wait(job_id)
        spec = job.spec
        self.assertEqual(spec["priority"], 5)
        self.assertEqual(spec["threads"], 1)
        self.assertEqual(spec["window_bytes"], str(1 << 20))
        self.assertEqual(spec["memory_budget"], str(64 << 20))
        self.assertEqual(spec["io"], "buffered")
        self.assertEqual(spec["output_format"], "safetensors")
        self.assertIs(spec["duplicate_tied"], True)
        self.assertNotIn("max_shard_size", spec)  # None: the daemon's default
        self.assertConsolidated(self.small, out)

    def test_hf_import_family_and_config_reach_the_job(self):
        # A Hugging Face folder without config.json, imported into Megatron-LM with the
        # config named by a path relative to the caller's folder and the family named apart
        # from config.json's (unknown) architectures.
        rng = np.random.default_rng(3)
        h, ffn, vocab = 8, 12, 20
        shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
                  "lm_head.weight": (vocab, h)}
        layer = {"input_layernorm.weight": (h,), "self_attn.q_proj.weight": (h, h),
                 "self_attn.k_proj.weight": (h // 2, h), "self_attn.v_proj.weight": (h // 2, h),
                 "self_attn.o_proj.weight": (h, h), "post_attention_layernorm.weight": (h,),
                 "mlp.gate_proj.weight": (ffn, h), "mlp.up_proj.weight": (ffn, h),
                 "mlp.down_proj.weight": (h, ffn)}
        shapes.update(("model.layers.0." + k, v) for k, v in layer.items())
        hf_dir = self.r("hf_no_config")
        os.makedirs(hf_dir)
        R.write_file(os.path.join(hf_dir, "model.safetensors"), {
            k: R.make_tensor("F32", rng.standard_normal(v).astype(np.float32))
            for k, v in shapes.items()})
        config = {"architectures": ["MyLlamaForCausalLM"], "model_type": "my_llama",
                  "hidden_size": h, "intermediate_size": ffn, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 64, "vocab_size": vocab}
        with open(self.r("hf_config.json"), "w") as f:
            json.dump(config, f)
        out = self.r("out_hf_import")
        cwd = os.getcwd()
        os.chdir(self.root)
        try:
            job_id = self.client.reshard(hf_dir, out, 2, output_format="megatron",
                                         hf_family="llama", hf_config_file="hf_config.json")
        finally:
            os.chdir(cwd)
        job = self.client.wait(job_id, timeout=120)
        self.assertEqual(job.state, "SUCCEEDED", job.error)
        self.assertEqual(job.spec["hf_config_file"],
                         os.path.join(os.path.realpath(self.root), "hf_config.json"))
        self.assertEqual(job.spec["hf_family"], "llama")
        self.assertEqual(sorted(os.listdir(os.path.join(out, "release"))),
                         ["mp_rank_00", "mp_rank_01"])
        self.assertFilesOnDisk(job)

    def test_plan_and_inspect(self):
        info = self.client.inspect(self.src)
        self.assertEqual(info.layout, "sharded")
        expected = R.read_folder(self.src)
        self.assertEqual(sorted(t.name for t in info.tensors), sorted(expected))
        for t in info.tensors:
            self.assertEqual(tuple(t.shape), tuple(expected[t.name].array.shape), t.name)
            self.assertEqual(t.dtype, "F32")
        self.assertEqual(info.total_bytes, sum(t.bytes for t in info.tensors))
        self.assertEqual(sorted(os.path.basename(p) for p, _ in info.files
                                if p.endswith(".safetensors")), R.list_safetensors(self.src))
        for path, size in info.files:
            self.assertEqual(os.path.getsize(path), size, path)
        plan = self.client.plan(self.src, max_shard_size="3MB", dtype="bf16")
        self.assertGreater(plan.memory_bytes, 0)
        self.assertGreater(plan.data_files, 1)
        out = self.r("out_planned")
        job = self.client.wait(self.client.consolidate(self.src, out, max_shard_size="3MB",
                                                       dtype="bf16"))
        written = {f.name: f.bytes for f in job.output_files}
        for f in plan.files[:plan.data_files]:
            self.assertEqual(written.get(f.name), f.bytes, f.name)
        self.assertEqual(len(plan.files[:plan.data_files]),
                         len([n for n in written if n.endswith(".safetensors")]))
        rplan = self.client.plan(self.rsrc, parts=2, rules=RULES)
        self.assertEqual([f.name for f in rplan.files[:rplan.data_files]],
                         ["model_part-%d.safetensors" % i for i in range(2)])
        merged = self.client.inspect(self.r("out_planned"))
        self.assertEqual(len(merged.tensors), len(info.tensors))
        self.assertTrue(all(t.dtype == "BF16" for t in merged.tensors))


class SecureClientTests(dh.OwnDaemonsTestCase):
    """The client against a daemon with mutual TLS and bearer tokens (certificates from a CA
    made with openssl at test time, tests/daemon/daemon_auth_test.py's make_pki)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pki = make_pki(os.path.join(cls.tmp, "pki"))
        cls.team_a = os.path.join(cls.root, "team-a")
        cls.team_b = os.path.join(cls.root, "team-b")
        cls.src_a = small_checkpoint(os.path.join(cls.team_a, "src"), seed=1)
        cls.src_b = small_checkpoint(os.path.join(cls.team_b, "src"), seed=2)
        cls.tokens = {"alice": "tok-alice-5f1d", "bob": "tok-bob-9a2c", "reader": "tok-reader-77e0"}
        entries = [
            token_entry("alice", cls.tokens["alice"], ["read", "submit", "cancel"], [cls.team_a]),
            token_entry("bob", cls.tokens["bob"], ["read", "submit", "cancel"], [cls.team_b]),
            token_entry("reader", cls.tokens["reader"], ["read"], [cls.team_a]),
        ]
        token_file = os.path.join(cls.tmp, "tokens.json")
        with open(token_file, "w") as f:
            json.dump({"tokens": entries}, f)
        os.chmod(token_file, 0o600)
        cls.secure = Daemon(cls.logs, os.path.join(cls.tmp, "state-secure"), [cls.root],
                            ("--tls-cert", cls.pki.path("server"), "--tls-key",
                             cls.pki.path("server", "key"), "--tls-client-ca", cls.pki.path("ca"),
                             "--auth-tokens", token_file)).start()
        cls.extra_daemons.append(cls.secure)

    def client(self, who=None, ca="ca", cert="client", **kw):
        return Client(self.secure.addr, token=self.tokens[who] if who else None,
                      tls_ca=self.pki.path(ca), tls_cert=self.pki.path(cert) if cert else None,
                      tls_key=self.pki.path(cert, "key") if cert else None, max_attempts=1, **kw)

    def assertRaisesCode(self, code, call, *args, **kw):
        with self.assertRaises(ReshardError) as raised:
            call(*args, **kw)
        self.assertEqual(raised.exception.code, code, raised.exception)
        return raised.exception

    def test_job_over_mutual_tls_with_a_token(self):
        out = os.path.join(self.team_a, "out")
        with self.client("alice") as alice:
            job = alice.wait(alice.consolidate(self.src_a, out, dtype="bf16"), timeout=120)
            self.assertEqual(job.state, "SUCCEEDED")
            self.assertEqual(job.owner, "alice")
            self.assertIn(job.id, [j.id for j in alice.list()])
        self.assertConsolidated(self.src_a, out, dtype="bf16")
        # Another team's token neither sees the job nor reads the team's folder.
        with self.client("bob") as bob:
            self.assertNotIn(job.id, [j.id for j in bob.list()])
            self.assertRaisesCode("NOT_FOUND", bob.get, job.id)
            self.assertRaisesCode("PERMISSION_DENIED", bob.consolidate, self.src_a,
                                  os.path.join(self.team_b, "stolen"))

    def test_refusals(self):
        with self.client(None) as anonymous:
            self.assertRaisesCode("UNAUTHENTICATED", anonymous.list)
        with Client(self.secure.addr, token="not-a-known-token", tls_ca=self.pki.path("ca"),
                    tls_cert=self.pki.path("client"), tls_key=self.pki.path("client", "key"),
                    max_attempts=1) as unknown:
            self.assertRaisesCode("UNAUTHENTICATED", unknown.list)
        with self.client("reader") as reader:
            error = self.assertRaisesCode("PERMISSION_DENIED", reader.consolidate, self.src_a,
                                          os.path.join(self.team_a, "by_reader"))
            self.assertIn("submit", error.message)
            reader.list()  # read is enough to list
        # No client certificate under mutual TLS, and a server certificate from another CA:
        # the handshake fails, the call is UNAVAILABLE.
        with self.client("alice", cert=None, rpc_timeout=10) as no_cert:
            self.assertRaisesCode("UNAVAILABLE", no_cert.list)
        with self.client("alice", ca="other-ca", rpc_timeout=10) as wrong_ca:
            self.assertRaisesCode("UNAVAILABLE", wrong_ca.list)
        log = self.secure.read_log()
        self.assertIn("audit:", log)
        for token in self.tokens.values():
            self.assertNotIn(token, log)


if __name__ == "__main__":
    dh.main()
