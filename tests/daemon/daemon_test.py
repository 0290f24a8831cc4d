"""End-to-end tests of `reshardd` (issue 3's Acceptance) through `reshardctl --server`.

Run (from the repository root, after `bazel build //server:reshardd //client:reshardctl
//tests/daemon:grpc_probe`):

    /usr/bin/python3 tests/daemon/daemon_test.py --reshardd bazel-bin/server/reshardd \
        --reshardctl bazel-bin/client/reshardctl --probe bazel-bin/tests/daemon/grpc_probe \
        [unittest args, e.g. CoreTests or SecurityTests.test_full_queue]

Every test class starts its own real daemon (tests/daemon/daemon_harness.py) and checks outputs
element by element with tests/st_reference.py against checkpoints that
tools/bench/make_checkpoint.py writes.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness as dh  # noqa: E402
from daemon_harness import *  # noqa: E402,F401,F403


class CoreTests(DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = make_checkpoint(os.path.join(cls.root, "src"), "16MiB", "5MB")
        # Even vocabulary and sizes: splits into 2 and 4 parts.
        cls.rsrc = make_checkpoint(os.path.join(cls.root, "rsrc"), "8MiB", "2MB", "--hidden",
                                   "128", "--layers", "2", "--vocab", "2048")
        cls.rules = os.path.join(cls.tmp, "rules.json")
        with open(cls.rules, "w") as f:
            json.dump(RULES, f)

    def test_submit_and_wait_consolidate(self):
        out = self.r("out_wait")
        doc = self.assertOk(self.ctl("consolidate", self.src, out, "--max-shard-size", "3MB",
                                     "--no-progress"))
        self.assertEqual(doc["state"], "succeeded")
        self.assertEqual(doc["kind"], "consolidate")
        self.assertEqual(doc["output"], os.path.realpath(out))
        self.assertEqual(doc["input"], os.path.realpath(self.src))
        job = doc["job"]
        self.assertEqual(job["id"], doc["job_id"])
        self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(job["attempts"], 1)
        self.assertEqual(progress_of(doc)[0], progress_of(doc)[1])
        self.assertGreater(progress_of(doc)[1], 0)
        self.assertGreater(int(job["bytes_written"]), 16 << 20)
        self.assertEqual(int(job["bytes_written"]), doc["bytes_written"])
        self.assertGreater(int(job["bytes_read"]), 0)
        self.assertGreater(int(job["reserved_memory_bytes"]), 0)
        self.assertGreaterEqual(float(job["finished_unix"]), float(job["started_unix"]))
        self.assertGreater(float(job["started_unix"]), 0)
        self.assertOutputFilesMatch(out, doc)
        shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        for n in shards:  # Hugging Face's rule: at most 3 MB of data, or one larger tensor
            _, items, _, _ = R.parse_header(os.path.join(out, n))
            if len(items) > 1:
                self.assertLessEqual(sum(e - b for _, _, _, b, e in items), 3_000_000, n)
        self.assertConsolidated(self.src, out)

    def test_dtype_bf16_through_daemon(self):
        out = self.r("out_bf16")
        doc = self.assertOk(self.ctl("consolidate", self.src, out, "--dtype", "bf16",
                                     "--no-progress"))
        self.assertEqual(doc["job"]["spec"]["dtype"], "DTYPE_BF16")
        self.assertConsolidated(self.src, out, dtype="bf16")

    def test_hugging_face_folder_carries_its_model_files(self):
        # A save_pretrained folder: sharded weights, config (both dtype keys, as transformers 5
        # writes them), tokenizer (larger than a companion file: copied verbatim), card.
        hf = make_checkpoint(self.r("hf_src"), "2MiB", "600KB", "--hidden", "64", "--layers", "2")
        config = {"architectures": ["LlamaForCausalLM"], "dtype": "float32",
                  "hidden_size": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                  "torch_dtype": "float32", "vocab_size": 32000}
        carried = {"config.json": json.dumps(config, indent=2) + "\n",
                   "tokenizer.json": json.dumps({"model": {"vocab": ["x" * 40] * 60000}}),
                   "tokenizer_config.json": "{}", "README.md": "# tiny\n"}
        self.assertGreater(len(carried["tokenizer.json"]), 1 << 21)
        for name, text in carried.items():
            with open(os.path.join(hf, name), "w") as f:
                f.write(text)
        # --tokenizer DIR: its files replace the input's of the same name.
        tok = self.r("hf_tok")
        os.makedirs(tok)
        with open(os.path.join(tok, "tokenizer_config.json"), "w") as f:
            f.write('{"from": "tok"}')
        carried["tokenizer_config.json"] = '{"from": "tok"}'

        doc = self.assertOk(self.ctl("inspect", hf))
        self.assertEqual([os.path.basename(f["path"]) for f in doc["model_files"]],
                         sorted(carried))
        self.assertEqual(doc["model_files"], run_ctl(["inspect", hf]).doc["model_files"])

        out = self.r("hf_out")
        doc = self.assertOk(self.ctl("consolidate", hf, out, "--dtype", "bf16", "--tokenizer",
                                     tok, "--no-progress"))
        self.assertEqual(doc["job"]["spec"]["tokenizer"], os.path.realpath(tok))
        self.assertOutputFilesMatch(out, doc)
        self.assertConsolidated(hf, out, dtype="bf16")
        for name, text in carried.items():
            with open(os.path.join(out, name)) as f:
                written = f.read()
            if name == "config.json":
                after = json.loads(written)
                self.assertEqual(list(after), list(config))  # same keys, same order
                self.assertEqual(after, dict(config, dtype="bfloat16", torch_dtype="bfloat16"))
            else:
                self.assertEqual(written, text, name)
        with open(os.path.join(out, "reshard-manifest.json")) as f:
            manifest = json.load(f)
        listed = {f["name"]: f["bytes"] for f in manifest["files"]}
        for name in carried:
            self.assertEqual(listed[name], os.path.getsize(os.path.join(out, name)), name)
        self.assertEqual(manifest["request"]["tokenizer"], os.path.realpath(tok))

        bare = self.r("hf_bare")
        doc = self.assertOk(self.ctl("consolidate", hf, bare, "--no-extra-files", "--no-progress"))
        self.assertIs(doc["job"]["spec"]["no_extra_files"], True)
        self.assertEqual([n for n in os.listdir(bare) if not n.endswith(".safetensors")],
                         ["reshard-manifest.json"])

    def test_detach_watch_status_list(self):
        out = self.r("out_detach")
        r = self.ctl("consolidate", self.src, out, "--detach")
        doc = self.assertOk(r)
        job_id = doc["job_id"]
        self.assertIn(doc["state"], ("queued", "running", "succeeded"))
        self.assertIn(job_id, r.stderr)
        # Without --json, --detach prints the job id alone.
        plain = run_ctl(["consolidate", self.src, self.r("out_detach_plain"), "--detach"],
                        server=self.daemon.addr, json_out=False)
        self.assertExit(plain, 0)
        self.assertRegex(plain.stdout, r"^\S+\n$")
        plain_id = plain.stdout.strip()
        self.assertNotEqual(plain_id, job_id)

        watched = self.assertOk(self.ctl("watch", job_id, "--no-progress"))
        self.assertEqual(watched["job_id"], job_id)
        self.assertEqual(watched["state"], "succeeded")
        self.assertOutputFilesMatch(out, watched)

        status = self.assertOk(self.ctl("status", job_id))
        self.assertEqual(status["state"], "succeeded")
        self.assertEqual(status["job"]["spec"]["kind"], "JOB_KIND_CONSOLIDATE")
        self.assertEqual(status["job"]["spec"]["input"], os.path.realpath(self.src))
        self.assertEqual(status["job"]["spec"]["output"], os.path.realpath(out))
        self.assertEqual(status["files"], watched["files"])
        self.assertGreater(status["job"]["timings"]["write_seconds"], 0)  # it wrote files

        self.wait_terminal(plain_id)
        listed = self.assertOk(self.ctl("list", "--state", "succeeded"))
        ids = [j["job_id"] for j in listed["jobs"]]
        self.assertIn(job_id, ids)
        self.assertIn(plain_id, ids)
        self.assertTrue(all(j["state"] == "succeeded" for j in listed["jobs"]), listed)
        self.assertLess(ids.index(plain_id), ids.index(job_id), "list is newest first")
        for state in ("queued", "running", "failed", "cancelled"):
            other = self.assertOk(self.ctl("list", "--state", state))
            self.assertNotIn(job_id, [j["job_id"] for j in other["jobs"]], state)
        newest = self.assertOk(self.ctl("list", "--limit", "1"))
        self.assertEqual([j["job_id"] for j in newest["jobs"]], [plain_id])
        both = self.assertOk(self.ctl("list", "--state", "succeeded", "--state", "failed"))
        self.assertIn(job_id, [j["job_id"] for j in both["jobs"]])
        self.assertConsolidated(self.src, out)

        self.assertError(self.ctl("status", "j-doesnotexist"), 3, "NOT_FOUND")
        self.assertError(self.ctl("watch", "j-doesnotexist"), 3, "NOT_FOUND")
        self.assertError(self.ctl("cancel", "j-doesnotexist"), 3, "NOT_FOUND")
        self.assertExit(self.ctl("list", "--state", "bogus"), 2)

    def test_plan_and_inspect_through_daemon(self):
        # inspect: the daemon's document matches the files' own headers and the local command.
        doc = self.assertOk(self.ctl("inspect", self.src))
        self.assertEqual(doc["format"], "safetensors")
        self.assertEqual(doc["layout"], "sharded")
        self.assertEqual(doc["parts"], 1)
        expected = {}
        for fn in R.list_safetensors(self.src):
            _, items, _, _ = R.parse_header(os.path.join(self.src, fn))
            for name, dt, shape, b, e in items:
                expected[name] = (dt, list(shape), e - b)
        got = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in doc["tensors"]}
        self.assertEqual(got, expected)
        self.assertEqual(doc["tensor_count"], len(expected))
        self.assertEqual(doc["total_bytes"], sum(v[2] for v in expected.values()))
        self.assertEqual(sorted(os.path.basename(f["path"]) for f in doc["files"]),
                         sorted(R.list_safetensors(self.src)))
        local = run_ctl(["inspect", self.src])
        self.assertExit(local, 0)
        for key in ("format", "layout", "parts", "merged", "tensors", "tensor_count",
                    "total_bytes", "metadata"):
            self.assertEqual(doc[key], local.doc[key], key)

        # plan: same files as the local dry run, no output written, and what the job then writes.
        before_plan = (sorted(os.listdir(self.root)), sorted(os.listdir(self.src)))
        plan = self.assertOk(self.ctl("plan", self.src, "--max-shard-size", "4MB"))
        self.assertEqual(plan["kind"], "consolidate")
        self.assertGreater(plan["memory_bytes"], 0)
        local_plan = run_ctl(["plan", self.src, "--max-shard-size", "4MB"])
        self.assertExit(local_plan, 0)
        self.assertEqual(plan["files"], local_plan.doc["files"])
        self.assertEqual(plan["total_bytes"], local_plan.doc["total_bytes"])
        self.assertEqual(plan["source_bytes_read"], local_plan.doc["source_bytes_read"])
        # memory_bytes means the same on both sides: the conversion's own estimate.
        self.assertEqual(plan["memory_bytes"], local_plan.doc["memory_bytes"])
        self.assertEqual((sorted(os.listdir(self.root)), sorted(os.listdir(self.src))),
                         before_plan, "plan wrote something")
        out = self.r("out_planned")
        done = self.assertOk(self.ctl("consolidate", self.src, out, "--max-shard-size", "4MB",
                                      "--no-progress"))
        planned = {f["name"]: f["bytes"] for f in plan["files"] if f["name"].endswith(".safetensors")}
        written = {n: os.path.getsize(os.path.join(out, n)) for n in os.listdir(out)
                   if n.endswith(".safetensors")}
        self.assertEqual(written, planned)
        # The reservation covers what the plan said the conversion needs, within the budget.
        reserved = int(done["job"]["reserved_memory_bytes"])
        self.assertGreaterEqual(reserved, plan["memory_bytes"])
        self.assertLessEqual(reserved, 8 << 30)

        # plan of a reshard, and inspect of parts merged with rules.
        rplan = self.assertOk(self.ctl("plan", self.rsrc, "--parts", "2", "--rules", self.rules))
        self.assertEqual(rplan["kind"], "reshard")
        self.assertEqual(sorted(f["name"] for f in rplan["files"]
                                if f["name"].endswith(".safetensors")),
                         ["model_part-0.safetensors", "model_part-1.safetensors"])
        local_rplan = run_ctl(["plan", self.rsrc, "--parts", "2", "--rules", self.rules])
        self.assertExit(local_rplan, 0)
        for key in ("files", "total_bytes", "source_bytes_read", "memory_bytes"):
            self.assertEqual(rplan[key], local_rplan.doc[key], key)
        self.assertError(self.ctl("inspect", self.r("missing")), 3, "NOT_FOUND")

    def test_inspect_says_what_hf_export_does_through_daemon(self):
        # A Megatron-LM checkpoint (real torch, tests/fixtures/hf_megatron_fixture.py): the
        # daemon's inspect says what --format hf writes it as, as the local one does.
        sys.path.insert(0, os.path.dirname(
            dh._find_source("tests/fixtures/hf_megatron_fixture.py")))
        import hf_megatron_fixture as hmf
        spec = hmf.Spec("qwen2", groups=2)
        folder = hmf.write_megatron_lm(self.r("megatron_qwen2"), spec, hmf.hf_state_dict(spec),
                                       2, 1, vocab_size=50)
        want = {"family": "qwen2", "note": "exports to Hugging Face as qwen2 (--format hf)"}
        self.assertEqual(self.assertOk(self.ctl("inspect", folder))["hf_export"], want)
        local = run_ctl(["inspect", folder])
        self.assertExit(local, 0)
        self.assertEqual(local.doc["hf_export"], want)
        # Other input has nothing to say of it.
        self.assertIsNone(self.assertOk(self.ctl("inspect", self.src))["hf_export"])

    def test_reshard_with_rules(self):
        source = R.read_folder(self.rsrc)
        for parts in (2, 4):
            out = self.r("out_parts%d" % parts)
            doc = self.assertOk(self.ctl("reshard", self.rsrc, out, "--parts", str(parts),
                                         "--rules", self.rules, "--no-progress"))
            self.assertEqual(doc["kind"], "reshard")
            self.assertOutputFilesMatch(out, doc)
            self.assertEqual(R.list_safetensors(out),
                             ["model_part-%d.safetensors" % i for i in range(parts)])
            actual = R.read_parts(out)
            expected = R.split_model(source, RULES, parts)
            self.assertEqual(len(actual), parts)
            for i, (exp, act) in enumerate(zip(expected, actual)):
                self.assertEqual(sorted(act), sorted(exp), "part %d" % i)
                for name in exp:
                    diff = R.diff_tensors(exp[name], act[name])
                    self.assertIsNone(diff, "part %d %s: %s" % (i, name, diff))
        # Model-parallel parts in: inspect merges them with the rules; consolidate restores the
        # original model.
        merged_doc = self.assertOk(self.ctl("inspect", self.r("out_parts2"), "--rules", self.rules))
        self.assertEqual(merged_doc["layout"], "model-parallel-parts")
        self.assertEqual(merged_doc["parts"], 2)
        self.assertIs(merged_doc["merged"], True)
        back = self.r("out_merged")
        self.assertOk(self.ctl("consolidate", self.r("out_parts4"), back, "--rules", self.rules,
                               "--no-progress"))
        self.assertConsolidated(self.rsrc, back)

    def test_partitioned_jobs_publish_one_output(self):
        # One reshardd per node would each run one partition; here one daemon runs both jobs.
        out = self.r("out_partitioned")
        plan = self.assertOk(self.ctl("plan", self.src, "--max-shard-size", "3MB",
                                      "--partitions", "2"))
        self.assertEqual(len(plan["partitions"]), 2)
        planned = sorted(n for p in plan["partitions"] for n in p["files"])
        docs = []
        for i in range(2):
            doc = self.assertOk(self.ctl("consolidate", self.src, out, "--max-shard-size", "3MB",
                                         "--partition", "%d/2" % i, "--no-progress"))
            self.assertEqual(doc["state"], "succeeded")
            self.assertEqual(doc["job"]["spec"]["partition_index"], i)
            self.assertEqual(doc["job"]["spec"]["partition_count"], 2)
            self.assertEqual(os.path.exists(out), i == 1, "published by the second job only")
            docs.append(doc)
        written = sorted(f["name"] for d in docs for f in d["files"] if f["name"].startswith("model-"))
        self.assertEqual(written, planned)
        self.assertConsolidated(self.src, out)
        # The same partition again finds the output its split published.
        again = self.assertOk(self.ctl("consolidate", self.src, out, "--max-shard-size", "3MB",
                                       "--partition", "0/2", "--no-progress",
                                       "--idempotency-key", "partition-rerun"))
        self.assertEqual(again["state"], "succeeded")
        # An index beyond the count is refused by the daemon too.
        bad = self.ctl("consolidate", self.src, self.r("out_bad_partition"), "--partition", "2/2",
                       "--no-progress")
        self.assertEqual(bad.rc, 2, bad)  # a usage error: nothing was submitted

    def test_partition_auto_keys_follow_the_partition(self):
        # `--partition auto` in the tasks of a Slurm array: each task's job carries its own
        # partition and default idempotency key, and a requeued task gets its job back.
        out = self.r("out_partition_auto")
        keys = []
        for task in range(2):
            env = {"SLURM_ARRAY_JOB_ID": "31", "SLURM_ARRAY_TASK_ID": str(task),
                   "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0",
                   "SLURM_ARRAY_TASK_MAX": "1"}
            args = ("consolidate", self.src, out, "--max-shard-size", "3MB", "--partition",
                    "auto", "--no-progress")
            doc = self.assertOk(self.ctl(*args, env=env))
            self.assertEqual(doc["state"], "succeeded", doc)
            self.assertEqual(doc["job"]["spec"]["partition_index"], task)
            self.assertEqual(doc["job"]["spec"]["partition_count"], 2)
            self.assertEqual(os.path.exists(out), task == 1, "published by the last task only")
            keys.append(doc["job"]["idempotency_key"])
            self.assertTrue(keys[-1].startswith("slurm-31-%d:" % task), keys[-1])
            again = self.assertOk(self.ctl(*args, env=env))
            self.assertEqual(again["job_id"], doc["job_id"], "the requeued task re-attaches")
        self.assertNotEqual(keys[0], keys[1])
        self.assertConsolidated(self.src, out)

    # -- 7: CLI contract for workflow engines ----------------------------------------------------

    def test_result_file_on_success_and_failure(self):
        rf = os.path.join(self.tmp, "result-ok.json")
        out = self.r("out_rf")
        r = self.ctl("consolidate", self.src, out, "--result-file", rf, "--no-progress")
        doc = self.assertOk(r)
        with open(rf) as f:
            self.assertEqual(json.load(f), doc)
        # Without --json the result file is still the JSON document; stdout is for people.
        rf2 = os.path.join(self.tmp, "result-text.json")
        r2 = run_ctl(["status", doc["job_id"], "--result-file", rf2], server=self.daemon.addr,
                     json_out=False)
        self.assertExit(r2, 0)
        with open(rf2) as f:
            self.assertEqual(json.load(f)["job_id"], doc["job_id"])
        self.assertIn(doc["job_id"], r2.stdout)

        # A failure of the job request (missing input): exit 3, NOT_FOUND, file written.
        rf3 = os.path.join(self.tmp, "result-missing.json")
        r3 = self.ctl("consolidate", self.r("nope"), self.r("out_nope"), "--result-file", rf3)
        err = self.assertError(r3, 3, "NOT_FOUND")
        with open(rf3) as f:
            self.assertEqual(json.load(f), err)
        self.assertNoOutput(self.r("out_nope"))
        # Without --json: nothing on stdout, the document in the file.
        rf4 = os.path.join(self.tmp, "result-missing-text.json")
        r4 = run_ctl(["consolidate", self.r("nope"), self.r("out_nope"), "--result-file", rf4],
                     server=self.daemon.addr, json_out=False)
        self.assertExit(r4, 3)
        with open(rf4) as f:
            self.assertEqual(json.load(f)["error"]["code"], "NOT_FOUND")

        # Usage errors locally (reshard into 0 parts): exit 2 and a result file too.
        rf5 = os.path.join(self.tmp, "result-usage.json")
        r5 = self.ctl("reshard", self.rsrc, self.r("out_norules"), "--parts", "0",
                      "--result-file", rf5)
        self.assertExit(r5, 2)
        with open(rf5) as f:
            usage = json.load(f)
        self.assertIs(usage["ok"], False)
        self.assertEqual(usage["exit_code"], 2)

    def test_daemon_unreachable_is_exit_7(self):
        addr = "127.0.0.1:%d" % free_closed_port()
        for args in (("consolidate", self.src, self.r("out_unreach")),
                     ("consolidate", self.src, self.r("out_unreach"), "--detach"),
                     ("status", "j-0000000000000000"),
                     ("list",),
                     ("inspect", self.src)):
            rf = os.path.join(self.tmp, "result-unreachable.json")
            if os.path.exists(rf):
                os.unlink(rf)
            r = run_ctl(list(args) + ["--result-file", rf], server=addr, timeout=120)
            self.assertExit(r, 7)
            self.assertIs(r.doc["ok"], False, r)
            self.assertEqual(r.doc["exit_code"], 7, r)
            self.assertEqual(r.doc["error"]["code"], "UNAVAILABLE", r)
            with open(rf) as f:
                self.assertEqual(json.load(f), r.doc)
        self.assertNoOutput(self.r("out_unreach"))
        # RESHARD_SERVER is the default for --server.
        r = run_ctl(["list"], env={"RESHARD_SERVER": self.daemon.addr})
        self.assertOk(r)
        r = run_ctl(["list"], env={"RESHARD_SERVER": addr})
        self.assertExit(r, 7)
        # Job commands without any daemon are usage errors.
        self.assertExit(run_ctl(["list"]), 2)

    def test_json_is_one_document_and_progress_on_stderr(self):
        out = self.r("out_json")
        r = self.ctl("consolidate", self.src, out)  # progress on (not a terminal: lines)
        doc = self.assertOk(r)
        self.assertEqual(r.stdout.strip().count("\n{"), 0)
        self.assertTrue(r.stdout.lstrip().startswith("{") and r.stdout.rstrip().endswith("}"))
        self.assertIn(doc["job_id"], r.stderr)
        for args in (("status", doc["job_id"]), ("list",), ("watch", doc["job_id"]),
                     ("cancel", doc["job_id"]), ("inspect", self.src), ("plan", self.src)):
            self.assertOk(self.ctl(*args))  # ctl() fails unless stdout is one document
        # Cancelling a finished job returns it unchanged.
        self.assertEqual(self.status(doc["job_id"])["state"], "succeeded")

    # -- 8: metrics --------------------------------------------------------------------------

    def test_metrics_after_a_job(self):
        before = self.daemon.metrics()
        self.assertEqual(metric(before, "reshard_memory_budget_bytes"), float(8 << 30))
        out = self.r("out_metrics")
        doc = self.assertOk(self.ctl("consolidate", self.src, out, "--no-progress"))
        after = self.daemon.metrics()
        labels = {"kind": "consolidate", "result": "succeeded"}
        self.assertEqual(metric(after, "reshard_jobs_finished_total", **labels),
                         metric(before, "reshard_jobs_finished_total", **labels) + 1)
        self.assertEqual(metric(after, "reshard_jobs_submitted_total", kind="consolidate"),
                         metric(before, "reshard_jobs_submitted_total", kind="consolidate") + 1)
        self.assertEqual(metric(after, "reshard_written_bytes_total"),
                         metric(before, "reshard_written_bytes_total") + doc["bytes_written"])
        self.assertEqual(metric(after, "reshard_read_bytes_total"),
                         metric(before, "reshard_read_bytes_total") + doc["bytes_read"])
        self.assertEqual(metric(after, "reshard_job_duration_seconds_count", kind="consolidate"),
                         metric(before, "reshard_job_duration_seconds_count",
                                kind="consolidate") + 1)
        self.assertEqual(metric(after, "reshard_jobs_running"), 0)
        self.assertEqual(metric(after, "reshard_jobs_queued"), 0)
        self.assertEqual(metric(after, "reshard_memory_reserved_bytes"), 0)
        # Duration buckets go up to hours.
        les = [float(dict(k[1])["le"]) for k in after
               if k[0] == "reshard_job_duration_seconds_bucket" and dict(k[1]).get("le") != "+Inf"]
        self.assertGreaterEqual(max(les), 3600)


# ------------------------------------------------------------------------------------------------
# 2, 3: cancel (queued, running), idempotent resubmit, priorities


class QueueTests(DaemonTestCase):
    """One slot. A blocker occupies it for as long as a test needs, whatever the disk's speed:
    the daemon's test-only fault point holds finished jobs before publishing while the `go`
    file is absent (RESHARD_TEST_FAULTS, lib/core/test_faults.h); a cancel ends the hold."""

    DAEMON_ARGS = ("--max-concurrent-jobs", "1")

    @classmethod
    def setUpClass(cls):
        cls.go = os.path.join(tempfile.mkdtemp(prefix="reshardd-go-"), "go")
        open(cls.go, "w").close()
        super().setUpClass()
        cls.daemon.kill()
        cls.daemon = Daemon(cls.logs, os.path.join(cls.tmp, "state"), [cls.root],
                            cls.DAEMON_ARGS,
                            env={"RESHARD_TEST_FAULTS": "before-publish=wait:" + cls.go}).start()
        cls.big = make_checkpoint(os.path.join(cls.root, "big"), BIG_SIZE, "200MB")
        cls.src = small_checkpoint(os.path.join(cls.root, "small"))

    def tearDown(self):
        open(self.go, "w").close()
        super().tearDown()

    def start_blocker(self, name):
        """A big job occupying the only slot until cancelled; returns (job id, output)."""
        if os.path.exists(self.go):
            os.unlink(self.go)
        out = self.r(name)
        job_id = self.submit(self.big, out, *BIG_ARGS)
        self.wait_running_with_progress(job_id, fraction=0.0)
        return job_id, out

    def cancel_and_check(self, job_id, out):
        doc = self.assertOk(self.ctl("cancel", job_id))
        open(self.go, "w").close()  # the jobs queued behind the blocker may publish
        self.assertEqual(doc["job_id"], job_id)
        final = self.wait_terminal(job_id, timeout=60)
        self.assertEqual(final["state"], "cancelled", final)
        self.assertEqual(final["job"]["error"]["code_name"], "CANCELLED", final)
        self.assertNoOutput(out)
        self.assertNoStaging(out)
        return final

    def test_cancel_queued_and_running(self):
        blocker, big_out = self.start_blocker("out_big_cancel")
        out2 = self.r("out_queued_cancel")
        queued = self.submit(self.src, out2)
        self.assertEqual(self.status(queued)["state"], "queued")
        doc = self.assertOk(self.ctl("cancel", queued))
        self.assertEqual(doc["state"], "cancelled")  # a queued job is cancelled at once
        st = self.ctl("status", queued)
        self.assertExit(st, 5)  # status of a cancelled job: exit 5
        self.assertEqual(st.doc["state"], "cancelled")
        w = self.ctl("watch", queued, "--no-progress")
        self.assertExit(w, 5)
        self.assertEqual(w.doc["state"], "cancelled")
        self.assertNoOutput(out2)
        self.assertNoStaging(out2)
        self.assertIn(queued, [j["job_id"] for j in
                               self.assertOk(self.ctl("list", "--state", "cancelled"))["jobs"]])

        # The big one is running (with a staging folder); cancel it mid-way.
        running = self.wait_running_with_progress(blocker, fraction=0.02)
        self.assertEqual(running["state"], "running")
        self.assertIn(blocker, [j["job_id"] for j in
                                self.assertOk(self.ctl("list", "--state", "running"))["jobs"]])
        final = self.cancel_and_check(blocker, big_out)
        done, total = progress_of(final)
        self.assertLess(done, total)
        # The slot is free again: a new job runs to completion.
        out3 = self.r("out_after_cancel")
        self.assertOk(self.ctl("consolidate", self.src, out3, "--no-progress"))
        self.assertConsolidated(self.src, out3)
        m = self.daemon.metrics()
        self.assertGreaterEqual(metric(m, "reshard_jobs_finished_total", kind="consolidate",
                                       result="cancelled"), 2)

    def test_waiting_client_sees_cancellation(self):
        blocker, big_out = self.start_blocker("out_big_waiter")
        rf = os.path.join(self.tmp, "waiter.json")
        proc = subprocess.Popen([dh.RESHARDCTL, "consolidate", self.src, self.r("out_waiter"),
                                 "--server", self.daemon.addr, "--json", "--no-progress",
                                 "--result-file", rf],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV})
        try:
            deadline = time.monotonic() + 30
            job_id = None
            while time.monotonic() < deadline and job_id is None:
                queued = self.assertOk(self.ctl("list", "--state", "queued"))["jobs"]
                job_id = queued[0]["job_id"] if queued else None
                time.sleep(0.05)
            self.assertIsNotNone(job_id, "the waiting client's job never showed up as queued")
            self.assertOk(self.ctl("cancel", job_id))
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 5, stderr)
        doc = json.loads(stdout)
        self.assertEqual(doc["state"], "cancelled")
        self.assertIs(doc["ok"], False)
        self.assertEqual(doc["exit_code"], 5)
        with open(rf) as f:
            self.assertEqual(json.load(f), doc)
        self.cancel_and_check(blocker, big_out)

    def test_idempotent_resubmit(self):
        blocker, big_out = self.start_blocker("out_big_idem")
        try:
            out = self.r("out_idem")
            first = self.submit(self.src, out, "--idempotency-key", "task-42")
            again = self.submit(self.src, out, "--idempotency-key", "task-42")
            self.assertEqual(again, first)
            self.assertEqual(self.status(first)["job"]["idempotency_key"], "task-42")
            # Same key, different spec: ALREADY_EXISTS, exit 3, nothing new queued.
            r = self.ctl("consolidate", self.src, out, "--dtype", "bf16", "--detach",
                         "--idempotency-key", "task-42")
            self.assertError(r, 3, "ALREADY_EXISTS", first)
            r = self.ctl("consolidate", self.src, self.r("out_idem_other"), "--detach",
                         "--idempotency-key", "task-42")
            self.assertError(r, 3, "ALREADY_EXISTS")
            # No key: every submit is a new job.
            a = self.submit(self.src, self.r("out_nokey"))
            b = self.submit(self.src, self.r("out_nokey"))
            self.assertNotEqual(a, b)
            self.assertOk(self.ctl("cancel", b))

            # Default key from a Slurm array task: same spec -> same job; another spec of the
            # same task -> another job (the spec hash is part of the key).
            slurm = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}
            s1 = self.submit(self.src, self.r("out_slurm"), env=slurm)
            s2 = self.submit(self.src, self.r("out_slurm"), env=slurm)
            self.assertEqual(s1, s2)
            key = self.status(s1)["job"]["idempotency_key"]
            self.assertTrue(key.startswith("slurm-7-3"), key)
            s3 = self.submit(self.src, self.r("out_slurm"), "--dtype", "bf16",
                             env={"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "4"})
            self.assertNotEqual(s3, s1)
            self.assertOk(self.ctl("cancel", s3))
            # An explicit key wins over the environment.
            e1 = self.submit(self.src, self.r("out_slurm"), "--idempotency-key", "explicit",
                             env=slurm)
            self.assertNotEqual(e1, s1)
            self.assertEqual(self.status(e1)["job"]["idempotency_key"], "explicit")
            self.assertOk(self.ctl("cancel", e1))
            # Kubernetes indexed Jobs.
            k1 = self.submit(self.src, self.r("out_k8s"), env={"JOB_COMPLETION_INDEX": "5"})
            k2 = self.submit(self.src, self.r("out_k8s"), env={"JOB_COMPLETION_INDEX": "5"})
            self.assertEqual(k1, k2)
            self.assertTrue(self.status(k1)["job"]["idempotency_key"].startswith("k8s-"))
        finally:
            self.cancel_and_check(blocker, big_out)
        # The re-attached jobs all finish correctly.
        for job_id, out_name in ((first, "out_idem"), (s1, "out_slurm"), (k1, "out_k8s"),
                                 (a, "out_nokey")):
            final = self.wait_terminal(job_id)
            self.assertEqual(final["state"], "succeeded", final)
            self.assertConsolidated(self.src, self.r(out_name))

    def test_resubmit_after_success_reattaches(self):
        # A requeued Slurm task whose job already finished must get that job back (exit 0),
        # not "output folder not empty": that is what the default key is for.
        out = self.r("out_reattach")
        slurm = {"SLURM_ARRAY_JOB_ID": "11", "SLURM_ARRAY_TASK_ID": "0"}
        first = self.assertOk(self.ctl("consolidate", self.src, out, "--no-progress", env=slurm))
        self.assertEqual(first["state"], "succeeded")
        again = self.ctl("consolidate", self.src, out, "--no-progress", env=slurm)
        doc = self.assertOk(again)
        self.assertEqual(doc["job_id"], first["job_id"])
        self.assertEqual(doc["state"], "succeeded")
        # The same with an explicit key, detached.
        keyed = self.assertOk(self.ctl("consolidate", self.src, self.r("out_reattach2"),
                                       "--no-progress", "--idempotency-key", "done-key-1"))
        again = self.assertOk(self.ctl("consolidate", self.src, self.r("out_reattach2"),
                                       "--detach", "--idempotency-key", "done-key-1"))
        self.assertEqual(again["job_id"], keyed["job_id"])
        self.assertEqual(again["state"], "succeeded")
        self.assertConsolidated(self.src, out)

    def test_priority_runs_first(self):
        blocker, big_out = self.start_blocker("out_big_prio")
        low = self.submit(self.src, self.r("out_low"))
        high = self.submit(self.src, self.r("out_high"), "--priority", "10")
        self.cancel_and_check(blocker, big_out)
        low_doc, high_doc = self.wait_terminal(low), self.wait_terminal(high)
        self.assertEqual(low_doc["state"], "succeeded")
        self.assertEqual(high_doc["state"], "succeeded")
        self.assertLessEqual(float(high_doc["job"]["started_unix"]),
                             float(low_doc["job"]["started_unix"]),
                             "the priority-10 job should start before the earlier priority-0 one")


# ------------------------------------------------------------------------------------------------
# 4: restarts


class RestartTests(DaemonTestCase):
    """One daemon per test (fresh state dir); the class daemon only hosts nothing."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.daemon.kill()  # each test starts its own
        cls.big = make_checkpoint(os.path.join(cls.root, "big"), BIG_SIZE, "200MB")

    def tearDown(self):
        for d in getattr(self, "_mine", []):
            d.kill()

    def new_daemon(self, *extra):
        state = tempfile.mkdtemp(prefix="state-", dir=self.tmp)
        d = Daemon(self.logs, state, [self.root], ("--max-concurrent-jobs", "1") + extra)
        self._mine = getattr(self, "_mine", []) + [d]
        self.extra_daemons.append(d)
        return d.start()

    def check_resumed(self, d, job_id, out, attempts_at_least=2):
        """After a restart: listed, the output never partial, then succeeded and correct."""
        listed = self.assertOk(self.ctl("list", daemon=d))
        self.assertIn(job_id, [j["job_id"] for j in listed["jobs"]])
        deadline = time.monotonic() + 180
        doc = None
        while time.monotonic() < deadline:
            doc = self.status(job_id, daemon=d)
            if doc["state"] in TERMINAL:
                break
            # Until the job is reported finished, the final name holds nothing or a complete
            # output (the rename is the last step before the state is recorded).
            if os.path.exists(out):
                self.assertTrue(os.path.isfile(os.path.join(out, MANIFEST)),
                                "partial output under the final name: %s" % os.listdir(out))
            time.sleep(0.05)
        self.assertIn(doc["state"], TERMINAL, "job never ended after restart: %s" % doc)
        if doc["state"] == "failed":
            # Acceptable per the issue only as an explicit failure, with nothing under OUT.
            self.assertTrue(doc["job"]["error"]["message"], doc)
            self.assertTrue(doc["job"]["error"]["code_name"], doc)
            self.assertNoOutput(out)
            self.fail("resumed job failed (explicitly): %s" % doc["job"]["error"])
        self.assertEqual(doc["state"], "succeeded", doc)
        self.assertGreaterEqual(doc["job"]["attempts"], attempts_at_least, doc)
        self.assertOutputFilesMatch(out, doc)
        self.assertConsolidatedStreaming(self.big, out, dtype="bf16")
        return doc

    def test_sigkill_while_running_then_restart(self):
        d = self.new_daemon()
        out = self.r("out_sigkill")
        job_id = self.submit(self.big, out, *BIG_ARGS, daemon=d)
        self.wait_running_with_progress(job_id, fraction=0.3, daemon=d)
        d.signal(signal.SIGKILL)
        d.wait(timeout=30)
        # The restart window: nothing under the final output name.
        self.assertNoOutput(out)
        d.start()
        self.assertNoOutput(out)
        doc = self.check_resumed(d, job_id, out)
        self.assertTrue(doc["job"]["note"] or doc["job"]["attempts"] >= 2, doc)

    def test_sigkill_twice_then_restart(self):
        d = self.new_daemon()
        out = self.r("out_sigkill2")
        job_id = self.submit(self.big, out, *BIG_ARGS, daemon=d)
        self.wait_running_with_progress(job_id, fraction=0.2, daemon=d)
        d.signal(signal.SIGKILL)
        d.wait(timeout=30)
        self.assertNoOutput(out)
        d.start()
        # Killed again early in the resumed attempt.
        self.wait_for(job_id, lambda doc: doc["state"] == "running", "running again", daemon=d,
                      interval=0.02)
        d.signal(signal.SIGKILL)
        d.wait(timeout=30)
        self.assertNoOutput(out)
        d.start()
        self.check_resumed(d, job_id, out, attempts_at_least=3)

    def test_sigkill_with_corrupted_committed_file(self):
        # A file the killed attempt had committed is damaged before the restart: the resumed
        # job must not keep it (its checksum no longer matches) and must end with correct output.
        d = self.new_daemon()
        out = self.r("out_corrupt")
        job_id = self.submit(self.big, out, *BIG_ARGS, daemon=d)
        doc = self.wait_for(job_id, lambda x: x["job"].get("committed_files") or
                            x["state"] in TERMINAL, "a committed file", daemon=d, interval=0.02)
        self.assertEqual(doc["state"], "running", doc)
        d.signal(signal.SIGKILL)
        d.wait(timeout=30)
        self.assertNoOutput(out)
        name = doc["job"]["committed_files"][0]["name"]
        found = [os.path.join(dirpath, name)
                 for dirpath, _, files in os.walk(staging_path(out)) if name in files]
        self.assertEqual(len(found), 1, "committed file %s not in the staging folder" % name)
        with open(found[0], "r+b") as f:
            f.seek(os.path.getsize(found[0]) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        d.start()
        self.assertNoOutput(out)
        self.check_resumed(d, job_id, out)

    def test_sigterm_graceful_then_resume(self):
        d = self.new_daemon("--shutdown-grace", "0")
        health = probe(d.addr, "health")
        self.assertEqual(health["code_name"], "OK", health)
        self.assertEqual(health["response"]["status"], "SERVING")
        out = self.r("out_sigterm")
        job_id = self.submit(self.big, out, *BIG_ARGS, daemon=d)
        self.wait_running_with_progress(job_id, fraction=0.2, daemon=d)
        d.signal(signal.SIGTERM)
        self.assertEqual(d.wait(timeout=60), 0, "reshardd did not exit 0 on SIGTERM:\n%s" %
                         tail(d.read_log()))
        gone = probe(d.addr, "health")
        self.assertEqual(gone["code_name"], "UNAVAILABLE", gone)
        self.assertNoOutput(out)
        d.start()
        self.assertNoOutput(out)
        doc = self.check_resumed(d, job_id, out)
        self.assertEqual(doc["job"]["attempts"], 2, doc)

    def test_drain_refuses_new_jobs(self):
        d = self.new_daemon("--shutdown-grace", "60")
        out = self.r("out_drain")
        job_id = self.submit(self.big, out, *BIG_ARGS, daemon=d)
        self.wait_running_with_progress(job_id, fraction=0.0, daemon=d)
        small = small_checkpoint(self.r("small_drain"))
        d.signal(signal.SIGTERM)
        # While the running job gets its grace period: NOT_SERVING, submits refused (retryable).
        health = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = probe(d.addr, "health")
            if health["code_name"] == "OK" and health["response"]["status"] == "NOT_SERVING":
                break
            time.sleep(0.02)
        self.assertEqual((health or {}).get("response", {}).get("status"), "NOT_SERVING", health)
        r = self.ctl("consolidate", small, self.r("out_drain_small"), "--detach", daemon=d)
        self.assertError(r, 7, "UNAVAILABLE")
        self.assertEqual(d.wait(timeout=120), 0, tail(d.read_log()))
        self.assertNoOutput(self.r("out_drain_small"))
        d.start()
        final = self.wait_terminal(job_id, daemon=d)
        self.assertEqual(final["state"], "succeeded", final)
        self.assertOutputFilesMatch(out, final)


# ------------------------------------------------------------------------------------------------
# 5: load


class LoadTests(DaemonTestCase):
    DAEMON_ARGS = ("--memory-budget", "1GiB", "--max-concurrent-jobs", "2")
    CLIENTS = 4
    JOBS_PER_CLIENT = 10
    RSS_LIMIT = 512 << 20

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sources = [small_checkpoint(os.path.join(cls.root, "src%d" % i), seed=i)
                       for i in range(cls.CLIENTS)]

    def test_forty_jobs_from_four_clients(self):
        d = self.daemon
        samples = []
        violations = []
        sampler_errors = []
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                try:
                    m = d.metrics()
                    reserved = metric(m, "reshard_memory_reserved_bytes")
                    budget = metric(m, "reshard_memory_budget_bytes")
                    running = metric(m, "reshard_jobs_running")
                    rss = d.rss_bytes()
                    samples.append((reserved, budget, running, rss))
                    if budget != float(1 << 30) or reserved > budget or running > 2 \
                            or rss > self.RSS_LIMIT:
                        violations.append((reserved, budget, running, rss))
                except Exception as e:  # noqa: BLE001 - reported below
                    sampler_errors.append(repr(e))
                stop.wait(0.02)

        results = {}  # (client, k) -> (job id, source, output)
        errors = []

        def client(i):
            try:
                mine = []
                for k in range(self.JOBS_PER_CLIENT):
                    out = self.r("out_c%d_j%d" % (i, k))
                    # 1..4 threads: 192..576 MiB reserved each, so two 4-thread jobs (1152 MiB)
                    # cannot run together under the 1 GiB budget.
                    threads = str(1 + (i + k) % 4)
                    r = run_ctl(["consolidate", self.sources[i], out, "--detach", "--threads",
                                 threads, "--max-shard-size", "1MB"], server=d.addr)
                    if r.rc != 0 or not r.doc or not r.doc.get("job_id"):
                        errors.append("submit: %r" % r)
                        continue
                    results[(i, k)] = (r.doc["job_id"], self.sources[i], out)
                    mine.append(r.doc["job_id"])
                for job_id in mine:
                    r = run_ctl(["watch", job_id, "--no-progress"], server=d.addr, timeout=300)
                    if r.rc != 0 or r.doc.get("state") != "succeeded":
                        errors.append("watch: %r" % r)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        sampler_thread = threading.Thread(target=sampler, daemon=True)
        sampler_thread.start()
        clients = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(self.CLIENTS)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(timeout=300)
        stop.set()
        sampler_thread.join(timeout=30)
        self.assertFalse(any(t.is_alive() for t in clients), "clients did not finish in time")
        self.assertEqual(errors, [])
        self.assertEqual(len(results), self.CLIENTS * self.JOBS_PER_CLIENT)
        self.assertFalse(sampler_errors[:5], "metrics could not be read")
        self.assertGreaterEqual(len(samples), 5)
        self.assertEqual(violations[:5], [], "reserved > budget, >2 running or RSS too high")
        self.assertGreater(max(s[0] for s in samples), 0, "never sampled a running job")
        max_rss = max(s[3] for s in samples)
        self.assertLess(max_rss, self.RSS_LIMIT)
        sys.stderr.write("\n  load: %d samples, max reserved %.0f MiB, max RSS %.0f MiB\n" % (
            len(samples), max(s[0] for s in samples) / 2**20, max_rss / 2**20))

        ids = {v[0] for v in results.values()}
        self.assertEqual(len(ids), self.CLIENTS * self.JOBS_PER_CLIENT)
        listed = self.assertOk(self.ctl("list", "--state", "succeeded", "--limit", "1000"))
        self.assertTrue(ids <= {j["job_id"] for j in listed["jobs"]})
        paged = self.assertOk(self.ctl("list", "--limit", "15"))
        self.assertEqual(len(paged["jobs"]), 15)
        for job_id, src, out in results.values():
            self.assertConsolidated(src, out)
        m = d.metrics()
        self.assertEqual(metric(m, "reshard_jobs_finished_total", kind="consolidate",
                                result="succeeded"), len(ids))
        self.assertEqual(metric(m, "reshard_memory_reserved_bytes"), 0)
        self.assertLess(d.rss_bytes(), self.RSS_LIMIT)


# ------------------------------------------------------------------------------------------------
# 6: security and limits


class SecurityTests(DaemonTestCase):
    DAEMON_ARGS = ("--max-queue", "2", "--max-concurrent-jobs", "1")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = small_checkpoint(os.path.join(cls.root, "src"))
        cls.outside_src = small_checkpoint(os.path.join(cls.outside, "secret"))
        cls.rules = os.path.join(cls.tmp, "rules.json")
        with open(cls.rules, "w") as f:
            json.dump(RULES, f)

    def test_input_outside_root(self):
        out = self.r("out_in_outside")
        self.assertError(self.ctl("consolidate", self.outside_src, out), 3, "PERMISSION_DENIED")
        self.assertError(self.ctl("inspect", self.outside_src), 3, "PERMISSION_DENIED")
        self.assertError(self.ctl("plan", self.outside_src), 3, "PERMISSION_DENIED")
        # ".." through reshardctl (it normalizes the path, which still lands outside).
        dotdot = self.root + "/../outside/secret"
        self.assertError(self.ctl("consolidate", dotdot, out), 3, "PERMISSION_DENIED")
        self.assertNoOutput(out)

    def test_output_outside_root(self):
        out = os.path.join(self.outside, "out_outside")
        self.assertError(self.ctl("consolidate", self.src, out), 3, "PERMISSION_DENIED")
        self.assertError(self.ctl("consolidate", self.src, self.root + "/../outside/o2"), 3,
                         "PERMISSION_DENIED")
        # The root itself is not a valid output (the staging folder would be outside).
        self.assertError(self.ctl("consolidate", self.src, self.root), 3, "PERMISSION_DENIED")
        self.assertNoOutput(out)
        self.assertNoOutput(os.path.join(self.outside, "o2"))
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret"])

    def test_raw_dotdot_paths(self):
        os.makedirs(self.r("sub"), exist_ok=True)
        spec = {"kind": "JOB_KIND_CONSOLIDATE", "input": self.src}
        cases = [
            # output through a folder that does not exist, then up twice
            dict(spec, output=self.r("newdir", "..", "..", "outside", "o1")),
            # output through an existing folder, then up twice
            dict(spec, output=self.r("sub", "..", "..", "outside", "o2")),
            # output whose last components are ".."
            dict(spec, output=self.r("sub", "..", "..")),
            # input through ".."
            dict(spec, input=self.r("sub", "..", "..", "outside", "secret"),
                 output=self.r("o3")),
        ]
        for s in cases:
            for method, request in (("SubmitJob", {"spec": s}), ("Plan", {"spec": s})):
                res = probe(self.daemon.addr, method, request)
                self.assertEqual(res["code_name"], "PERMISSION_DENIED", (method, s, res))
        res = probe(self.daemon.addr, "Inspect",
                    {"input": self.r("sub", "..", "..", "outside", "secret")})
        self.assertEqual(res["code_name"], "PERMISSION_DENIED", res)
        # Relative paths are refused as malformed.
        res = probe(self.daemon.addr, "SubmitJob",
                    {"spec": dict(spec, output="relative/out")})
        self.assertEqual(res["code_name"], "INVALID_ARGUMENT", res)
        self.assertIn("absolute", res["message"])
        # ".." that stays inside the root is fine (and resolved).
        res = probe(self.daemon.addr, "Plan",
                    {"spec": dict(spec, output=self.r("sub", "..", "o_inside"))})
        self.assertEqual(res["code_name"], "OK", res)
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret"])

    def test_symlink_escapes(self):
        os.symlink(self.outside, self.r("link_out"))
        os.symlink(self.outside_src, self.r("link_in"))
        # Output below a symlinked folder that leads outside.
        out = self.r("link_out", "escaped")
        self.assertError(self.ctl("consolidate", self.src, out), 3, "PERMISSION_DENIED")
        self.assertNoOutput(os.path.join(self.outside, "escaped"))
        # Output that is itself a symlink to a folder outside.
        os.makedirs(os.path.join(self.outside, "target"))
        os.symlink(os.path.join(self.outside, "target"), self.r("link_target"))
        self.assertError(self.ctl("consolidate", self.src, self.r("link_target"), "--overwrite"),
                         3, "PERMISSION_DENIED")
        self.assertEqual(os.listdir(os.path.join(self.outside, "target")), [])
        # Input that is a symlink leading outside.
        self.assertError(self.ctl("consolidate", self.r("link_in"), self.r("o_link_in")), 3,
                         "PERMISSION_DENIED")
        self.assertError(self.ctl("inspect", self.r("link_in")), 3, "PERMISSION_DENIED")
        self.assertNoOutput(self.r("o_link_in"))
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret", "target"])

    def test_tokenizer_folder_outside_root(self):
        tok = os.path.join(self.outside, "tok")
        os.makedirs(tok)
        with open(os.path.join(tok, "tokenizer.json"), "w") as f:
            f.write("{}")
        out = self.r("o_tok_outside")
        self.assertError(self.ctl("consolidate", self.src, out, "--tokenizer", tok), 3,
                         "PERMISSION_DENIED", "spec.tokenizer")
        self.assertNoOutput(out)

    def test_hf_config_file_outside_root(self):
        # --config FILE is read by the job: refused at submit (and by Plan) unless inside a root,
        # so that no job is queued to read it. (Beside the root: other tests pin what the
        # folder `outside` holds.)
        config = os.path.join(self.tmp, "hf_config.json")
        with open(config, "w") as f:
            f.write("{}")
        out = self.r("o_config_outside")
        message = r"^spec\.hf_config_file: input %s is not in an allowed local root \(" % (
            re.escape(config))
        self.assertError(self.ctl("consolidate", self.src, out, "--format", "hf", "--config",
                                  config, "--detach"), 3, "PERMISSION_DENIED", message)
        self.assertError(self.ctl("plan", self.src, "--format", "hf", "--config", config), 3,
                         "PERMISSION_DENIED", message)
        self.assertNoOutput(out)

    def test_hf_flags_for_jobs_that_ignore_them_through_the_daemon(self):
        # The daemon refuses what the Python client or any gRPC client sends, with reshardctl's
        # rule named as JobSpec fields.
        spec = {"kind": "JOB_KIND_CONSOLIDATE", "input": self.src, "output": self.r("o_family"),
                "hf_family": "llama"}
        res = probe(self.daemon.addr, "SubmitJob", {"spec": spec})
        self.assertEqual(res["code_name"], "INVALID_ARGUMENT", res)
        self.assertEqual(res["message"],
                         "spec.hf_family is only for spec.output_format hf (a Hugging Face model "
                         "written from a Megatron checkpoint) and for a Hugging Face model "
                         "imported with spec.output_format megatron or megatron-torch-dist; not "
                         "for output format safetensors")
        # Marked as a usage error for any client (exit 2); other refusals are not.
        self.assertEqual(res["trailing_metadata"], {"reshard-usage-error": "--family"})
        planned = probe(self.daemon.addr, "Plan", {"spec": spec})
        self.assertEqual((planned["code_name"], planned["message"], planned["trailing_metadata"]),
                         ("INVALID_ARGUMENT", res["message"], {"reshard-usage-error": "--family"}))
        inside = dict(spec, hf_family="", output=os.path.join(self.src, "o_inside"))
        res = probe(self.daemon.addr, "SubmitJob", {"spec": inside})
        self.assertEqual((res["code_name"], res["message"], res["trailing_metadata"]),
                         ("INVALID_ARGUMENT",
                          "spec.output must not be, contain or lie inside the input", {}))
        # reshardctl refuses it before sending: a usage error.
        self.assertError(self.ctl("consolidate", self.src, self.r("o_vocab"), "--vocab-size",
                                  "50", "--detach"), 2, "INVALID_ARGUMENT",
                         r"^--vocab-size is only for --format hf ")
        self.assertNoOutput(self.r("o_family"))
        self.assertNoOutput(self.r("o_vocab"))

    def test_flag_refused_once_the_input_is_read_exits_as_in_process(self):
        # --family / --config for an input that is not a Hugging Face model folder are refused
        # when the job plans (the input must be read to know): through reshardd too, a usage
        # error (exit 2) with the message reshardctl gives in-process.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "fixtures"))
        import hf_megatron_fixture as hmf
        spec = hmf.Spec("llama", groups=2)
        folder = hmf.write_megatron_lm(self.r("mlm"), spec, hmf.hf_state_dict(spec), 1, 1)
        config = self.r("config.json")
        with open(config, "w") as f:
            json.dump({"rope_theta": 10000.0}, f)
        for i, flags in enumerate((["--family", "llama"], ["--config", config])):
            args = ["reshard", folder, self.r("o_hf_flag_%d" % i), "--format", "megatron",
                    "--parts", "1", "--no-progress"] + flags
            with self.subTest(flags=flags):
                local = self.assertError(run_ctl(args), 2, "INVALID_ARGUMENT")
                self.assertEqual(
                    local["error"]["message"],
                    "%s: %s is only for --format hf (a Hugging Face model written from a "
                    "Megatron checkpoint) and for a Hugging Face model imported with --format "
                    "megatron or megatron-torch-dist; the input is megatron, not a Hugging Face "
                    "model folder" % (folder, flags[0]))
                remote = self.ctl(*args)
                self.assertExit(remote, 2)
                self.assertEqual((remote.doc["ok"], remote.doc["exit_code"], remote.doc["state"]),
                                 (False, 2, "failed"), repr(remote))
                error = remote.doc["job"]["error"]
                self.assertEqual((error["code_name"], error["message"], error["usage_error"]),
                                 ("INVALID_ARGUMENT", local["error"]["message"], True))
                self.assertNoOutput(self.r("o_hf_flag_%d" % i))
                # A dry run through reshardd: the refused Plan call is a usage error too.
                plan = ["plan", folder, "--format", "megatron", "--parts", "1"] + flags
                local_plan = self.assertError(run_ctl(plan), 2, "INVALID_ARGUMENT")
                remote_plan = self.assertError(self.ctl(*plan), 2, "INVALID_ARGUMENT")
                self.assertEqual(remote_plan["error"]["message"], local_plan["error"]["message"])

    def test_pipeline_parts_refused_for_outputs_without_stages(self):
        spec = {"kind": "JOB_KIND_RESHARD", "input": self.src, "output": self.r("o_pp"),
                "parts": 1, "pipeline_parts": 2, "output_format": "torch"}
        res = probe(self.daemon.addr, "SubmitJob", {"spec": spec})
        self.assertEqual(res["code_name"], "INVALID_ARGUMENT", res)
        self.assertEqual(res["message"],
                         "spec.pipeline_parts is only for spec.output_format megatron and "
                         "megatron-torch-dist (the outputs with pipeline stages); not for output "
                         "format torch")
        # reshardctl refuses it before sending, as in-process: a usage error.
        args = ["reshard", self.src, self.r("o_pp2"), "--parts", "1", "--pipeline-parts", "2"]
        for res in (run_ctl(args), self.ctl(*args)):
            self.assertError(res, 2, "INVALID_ARGUMENT",
                             r"^--pipeline-parts is only for --format megatron and "
                             r"megatron-torch-dist \(the outputs with pipeline stages\); not "
                             r"for output format safetensors$")
        self.assertNoOutput(self.r("o_pp"))
        self.assertNoOutput(self.r("o_pp2"))

    def test_symlinked_file_inside_input_folder(self):
        # A folder inside the root whose shard files are symlinks to files outside it: reading
        # them would read outside the allowed roots.
        mixed = self.r("mixed")
        os.makedirs(mixed)
        for name in os.listdir(self.outside_src):
            os.symlink(os.path.join(self.outside_src, name), os.path.join(mixed, name))
        out = self.r("o_mixed")
        r = self.ctl("consolidate", mixed, out, "--no-progress")
        self.assertError(r, 3, "PERMISSION_DENIED")
        self.assertNoOutput(out)
        self.assertError(self.ctl("inspect", mixed), 3, "PERMISSION_DENIED")

    def test_full_queue(self):
        big = make_checkpoint(self.r("big"), BIG_SIZE, "200MB")
        blocker = self.submit(big, self.r("o_big"), *BIG_ARGS)
        self.wait_running_with_progress(blocker, fraction=0.0)
        try:
            q1 = self.submit(self.src, self.r("o_q1"))
            q2 = self.submit(self.src, self.r("o_q2"))
            rf = os.path.join(self.tmp, "full.json")
            r = self.ctl("consolidate", self.src, self.r("o_q3"), "--detach", "--result-file", rf)
            self.assertError(r, 6, "RESOURCE_EXHAUSTED", "queue")
            with open(rf) as f:
                self.assertEqual(json.load(f)["error"]["code"], "RESOURCE_EXHAUSTED")
            # Waiting mode answers the same.
            self.assertError(self.ctl("consolidate", self.src, self.r("o_q4")), 6,
                             "RESOURCE_EXHAUSTED")
            for job_id in (q1, q2):
                self.assertEqual(self.status(job_id)["state"], "queued")
            # Cancelling a queued job makes room again.
            self.assertOk(self.ctl("cancel", q2))
            q5 = self.submit(self.src, self.r("o_q5"))
        finally:
            self.assertOk(self.ctl("cancel", blocker))
        final = self.wait_terminal(blocker)
        self.assertEqual(final["state"], "cancelled")
        for job_id, name in ((q1, "o_q1"), (q5, "o_q5")):
            doc = self.wait_terminal(job_id)
            self.assertEqual(doc["state"], "succeeded", doc)
            self.assertConsolidated(self.src, self.r(name))
        self.assertNoOutput(self.r("o_q3"))
        self.assertNoOutput(self.r("o_big"))
        self.assertNoStaging(self.r("o_big"))
        shutil.rmtree(big)

    def test_job_that_can_never_fit(self):
        small = Daemon(self.logs, os.path.join(self.tmp, "state-small"), [self.root],
                       ("--memory-budget", "64MiB"))
        self.extra_daemons.append(small)
        small.start()
        try:
            out = self.r("o_nofit")
            self.assertError(self.ctl("consolidate", self.src, out, "--threads", "1",
                                      daemon=small), 6, "RESOURCE_EXHAUSTED", "memory|budget")
            self.assertError(self.ctl("consolidate", self.src, out, "--detach", daemon=small), 6,
                             "RESOURCE_EXHAUSTED")
            self.assertNoOutput(out)
            self.assertEqual(self.assertOk(self.ctl("list", daemon=small))["jobs"], [])
        finally:
            small.kill()
        # On the main daemon (8 GiB budget): a job asking for more than the budget.
        self.assertError(self.ctl("consolidate", self.src, self.r("o_nofit2"), "--memory-budget",
                                  "64GiB"), 6, "RESOURCE_EXHAUSTED")

    def test_malformed_requests(self):
        # reshard into 0 parts: refused locally, exit 2, the daemon never sees it.
        before = self.daemon.metrics()
        self.assertExit(self.ctl("reshard", self.src, self.r("o_m1"), "--parts", "0"), 2)
        self.assertExit(self.ctl("consolidate", self.src, self.r("o_m1"), "--dtype", "fp8"), 2)
        self.assertExit(self.ctl("consolidate", self.src, self.r("o_m1"), "--max-shard-size",
                                 "lots"), 2)
        # Bad rules sent to the daemon: INVALID_ARGUMENT, exit 3, a message naming the problem.
        bad_json = os.path.join(self.tmp, "bad.json")
        with open(bad_json, "w") as f:
            f.write('{"rules": [ {"pattern": "x", "split_dim": 0 ')
        bad_regex = os.path.join(self.tmp, "bad_regex.json")
        with open(bad_regex, "w") as f:
            json.dump({"rules": [{"pattern": "(unclosed", "split_dim": 0}]}, f)
        no_action = os.path.join(self.tmp, "no_action.json")
        with open(no_action, "w") as f:
            json.dump({"rules": [{"pattern": ".*"}]}, f)
        too_many = os.path.join(self.tmp, "too_many.json")
        with open(too_many, "w") as f:
            json.dump({"rules": [{"pattern": "p%d$" % i, "replicate": True}
                                 for i in range(5000)]}, f)
        for rules in (bad_json, bad_regex, no_action, too_many):
            r = self.ctl("reshard", self.src, self.r("o_m2"), "--parts", "2", "--rules", rules)
            self.assertError(r, 3, "INVALID_ARGUMENT", "rule|pattern|JSON|json")
        r = self.ctl("reshard", self.src, self.r("o_m2"), "--parts", "2", "--rules", too_many)
        self.assertIn("5000", r.doc["error"]["message"])
        self.assertError(self.ctl("consolidate", self.src, self.r("o_m2"), "--priority", "1000"),
                         3, "INVALID_ARGUMENT", "priority")
        self.assertError(self.ctl("consolidate", self.src, self.r("o_m2"), "--idempotency-key",
                                  "k" * 300), 3, "INVALID_ARGUMENT", "idempotency")
        self.assertError(self.ctl("consolidate", self.src, self.r("o_m2"), "--threads", "100"),
                         3, "INVALID_ARGUMENT", "threads")
        self.assertNoOutput(self.r("o_m1"))
        self.assertNoOutput(self.r("o_m2"))
        # Raw requests reshardctl would never build.
        base = {"kind": "JOB_KIND_CONSOLIDATE", "input": self.src, "output": self.r("o_m3")}
        for spec, field in (({k: v for k, v in base.items() if k != "kind"}, "kind"),
                            (dict(base, input=""), "input"),
                            (dict(base, output=""), "output"),
                            (dict(base, kind="JOB_KIND_RESHARD", parts=0, rules_json="{}"),
                             "parts"),
                            (dict(base, parts=3), "parts"),
                            (dict(base, rules_json="r" * (1 << 20 | 1)), "1 MiB")):
            res = probe(self.daemon.addr, "SubmitJob", {"spec": spec})
            self.assertEqual(res["code_name"], "INVALID_ARGUMENT", (spec.get("kind"), field, res))
            self.assertIn(field, res["message"])
        # A request larger than the daemon's cap is refused, not read.
        res = probe(self.daemon.addr, "SubmitJob",
                    {"spec": dict(base, rules_json="r" * (3 << 20))})
        # gRPC refuses a message over the daemon's receive limit before any handler runs.
        self.assertEqual(res["code_name"], "RESOURCE_EXHAUSTED", res)
        # A request without a job id is malformed, not a question about a missing job.
        res = probe(self.daemon.addr, "GetJob", {"id": ""})
        self.assertEqual(res["code_name"], "INVALID_ARGUMENT", res)
        self.assertIn("id is empty", res["message"])
        after = self.daemon.metrics()
        self.assertEqual(metric(after, "reshard_jobs_submitted_total", kind="consolidate"),
                         metric(before, "reshard_jobs_submitted_total", kind="consolidate"))
        self.assertEqual(metric(after, "reshard_jobs_submitted_total", kind="reshard"),
                         metric(before, "reshard_jobs_submitted_total", kind="reshard"))
        # reshard without rules of an input whose format has none of its own (Megatron's has):
        # the job fails naming --rules, nothing is written.
        r = self.ctl("reshard", self.src, self.r("o_m4"), "--parts", "2")
        self.assertExit(r, 3)
        self.assertEqual(r.doc["state"], "failed", repr(r))
        self.assertEqual(r.doc["job"]["error"]["code_name"], "INVALID_ARGUMENT", repr(r))
        self.assertIn("--rules", r.doc["job"]["error"]["message"], repr(r))
        self.assertNoOutput(self.r("o_m4"))

    def test_non_empty_output_and_overwrite(self):
        out = self.r("o_full")
        os.makedirs(out)
        with open(os.path.join(out, "keep.txt"), "w") as f:
            f.write("old")
        r = self.ctl("consolidate", self.src, out, "--no-progress")
        self.assertError(r, 3, "FAILED_PRECONDITION", "empty|overwrite")
        self.assertEqual(os.listdir(out), ["keep.txt"])
        # An existing empty folder is fine.
        empty = self.r("o_empty")
        os.makedirs(empty)
        self.assertOk(self.ctl("consolidate", self.src, empty, "--no-progress"))
        self.assertConsolidated(self.src, empty)
        # --overwrite replaces the old contents.
        doc = self.assertOk(self.ctl("consolidate", self.src, out, "--overwrite", "--no-progress"))
        self.assertTrue(doc["job"]["spec"]["overwrite"])
        self.assertNotIn("keep.txt", os.listdir(out))
        self.assertConsolidated(self.src, out)
        # An output that is a file.
        with open(self.r("o_file"), "w") as f:
            f.write("x")
        self.assertIn(self.ctl("consolidate", self.src, self.r("o_file")).rc, (3,))
        # The output must not be or contain the input (--overwrite would delete it).
        nest = self.r("nest")
        inner = small_checkpoint(os.path.join(nest, "src"))
        before = {n: xxh3_64_file(os.path.join(inner, n)) for n in os.listdir(inner)}
        for target in (nest, inner):
            self.assertError(self.ctl("consolidate", inner, target, "--overwrite"), 3,
                             "INVALID_ARGUMENT", "input")
        self.assertEqual({n: xxh3_64_file(os.path.join(inner, n)) for n in os.listdir(inner)},
                         before)



class StateFolderTests(OwnDaemonsTestCase):
    """The state folder and the job database name every tenant's paths and tokens: only the
    daemon's user may read them (folder 0700, jobs.sqlite3 and its -wal and -shm 0600), whatever
    the umask, and a folder left group- or other-readable is made private at start."""

    DB_FILES = ("jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.src = small_checkpoint(os.path.join(cls.root, "src"))

    def modes(self, state):
        return {name: oct(os.stat(os.path.join(state, name)).st_mode & 0o7777)
                for name in (".",) + self.DB_FILES}

    def run_job_and_check(self, state, umask, name):
        old = os.umask(umask)
        try:
            d = self.new_daemon(state=state)
        finally:
            os.umask(old)
        job_id = self.submit(self.src, self.r(name), daemon=d)
        self.assertEqual(self.wait_terminal(job_id, daemon=d)["state"], "succeeded")
        # The daemon keeps the database open in WAL mode, so -wal and -shm exist now.
        self.assertEqual(self.modes(state), {".": "0o700", "jobs.sqlite3": "0o600",
                                             "jobs.sqlite3-wal": "0o600",
                                             "jobs.sqlite3-shm": "0o600"})
        d.kill()

    def test_new_state_folder_is_private(self):
        self.run_job_and_check(os.path.join(self.tmp, "state-022"), 0o022, "out_022")

    def test_new_state_folder_is_private_under_umask_000(self):
        self.run_job_and_check(os.path.join(self.tmp, "state-000"), 0o000, "out_000")

    def test_existing_open_state_folder_is_made_private(self):
        state = os.path.join(self.tmp, "state-open")
        os.mkdir(state)
        os.chmod(state, 0o755)
        for name in self.DB_FILES:  # as an earlier reshardd left them (SQLite's default 0644)
            with open(os.path.join(state, name), "wb"):
                pass
            os.chmod(os.path.join(state, name), 0o644)
        os.remove(os.path.join(state, "jobs.sqlite3-wal"))
        self.run_job_and_check(state, 0o022, "out_open")


# ------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO checkpoints through the daemon (--tag, --include-optimizer, the description)


if __name__ == "__main__":
    dh.main()
