"""reshardd with a DeepSpeed ZeRO-3 checkpoint that tests/fixtures/zero_fixture.py writes with
real PyTorch: --tag, --include-optimizer, --dtype bf16 through the daemon, inspect's description,
and tags with ".." refused. Run like tests/daemon/daemon_test.py (same flags).
"""

import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness as dh  # noqa: E402
from daemon_harness import *  # noqa: E402,F401,F403


def _zero_fixture():
    """tests/fixtures/zero_fixture.py (imports torch: only this class needs it)."""
    sys.path.insert(0, os.path.dirname(dh._find_source("tests/fixtures/zero_fixture.py")))
    import zero_fixture  # noqa: E402
    return zero_fixture


class ZeroTests(DaemonTestCase):
    """A small ZeRO-3 checkpoint written with real torch by tests/fixtures/zero_fixture.py."""

    TAG = "global_step10"
    DESCRIPTION = ("DeepSpeed ZeRO-3 (bf16), 4 data-parallel ranks, tag global_step10, "
                   "20 parameters (2 frozen, 1 shared), 5 buffers")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import torch
        cls.torch = torch
        cls.zf = _zero_fixture()
        cls.save_dir = os.path.join(cls.root, "zero_run")
        # The tag asked for, and a later one that `latest` names: --tag must pick global_step10.
        cls.ck = cls.zf.write_zero_checkpoint(cls.save_dir, cls.zf.small_model(seed=5), 3, 4,
                                              cls.TAG, half_dtype=torch.bfloat16,
                                              sub_group_size=40)
        cls.zf.write_zero_checkpoint(cls.save_dir, cls.zf.small_model(seed=6), 2, 2,
                                     "global_step20", half_dtype=torch.bfloat16)
        with open(os.path.join(cls.save_dir, "latest")) as f:
            assert f.read() == "global_step20"
        # A checkpoint outside the allowed root that a tag with ".." would reach.
        cls.zf.write_zero_checkpoint(os.path.join(cls.outside, "secret_run"),
                                     cls.zf.small_model(seed=7), 2, 1, "global_step1")

    def read_output(self, out):
        """name -> torch tensor of a consolidated safetensors folder (tied aliases resolved)."""
        torch = self.torch
        of = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
              "I64": torch.int64, "BOOL": torch.bool}
        got = {}
        for name, t in R.read_folder(out).items():
            raw = t.raw()
            got[name] = (torch.frombuffer(bytearray(raw), dtype=of[t.dtype]).reshape(t.shape)
                         if raw else torch.empty(tuple(t.shape), dtype=of[t.dtype]))
        for fn in R.list_safetensors(out):
            meta = R.read_file(os.path.join(out, fn), with_metadata=True)[1] or {}
            for alias, kept in meta.items():
                if kept in got and alias not in got:
                    got[alias] = got[kept]
        return got

    def test_consolidate_zero3_with_tag_optimizer_bf16(self):
        torch = self.torch
        out = self.r("out_zero3")
        doc = self.assertOk(self.ctl("consolidate", self.save_dir, out, "--tag", self.TAG,
                                     "--include-optimizer", "--dtype", "bf16", "--no-progress"))
        self.assertEqual(doc["state"], "succeeded")
        spec = doc["job"]["spec"]
        self.assertEqual(spec["tag"], self.TAG)
        self.assertIs(spec["include_optimizer"], True)
        self.assertOutputFilesMatch(out, doc)
        self.assertNoStaging(out)

        def bf16(t):  # --dtype bf16 converts floating tensors, rounding to nearest even
            return t.to(torch.bfloat16) if t.is_floating_point() else t

        expected = {name: bf16(t) for name, t in self.ck.expected.items()}
        for name in self.ck.exp_avg:
            expected[name + ".exp_avg"] = bf16(self.ck.exp_avg[name])
            expected[name + ".exp_avg_sq"] = bf16(self.ck.exp_avg_sq[name])
        got = self.read_output(out)
        self.assertEqual(sorted(got), sorted(expected))
        for name, want in expected.items():
            have = got[name]
            self.assertEqual(have.dtype, want.dtype, name)
            self.assertEqual(tuple(have.shape), tuple(want.shape), name)
            self.assertTrue(torch.equal(have, want), "%s: values differ" % name)

    def test_universal_checkpoint_through_the_daemon(self):
        """--format deepspeed-universal as a daemon job: files in subfolders (zero/<param>/...)
        are listed with their XXH3-64, the values are the fp32 master weights and moments, and
        --update-latest writes latest_universal beside the output."""
        torch = self.torch
        saves = self.r("universal_saves")
        out = os.path.join(saves, "global_step10_universal")
        doc = self.assertOk(self.ctl("consolidate", self.save_dir, out, "--tag", self.TAG,
                                     "--format", "deepspeed-universal", "--update-latest",
                                     "--no-progress"))
        self.assertEqual(doc["state"], "succeeded")
        spec = doc["job"]["spec"]
        self.assertEqual(spec["output_format"], "deepspeed-universal")
        self.assertIs(spec["update_latest"], True)
        self.assertOutputFilesMatch(out, doc)
        self.assertNoStaging(out)
        listed = {f["name"] for f in doc["files"]}
        for name in self.ck.exp_avg:
            for state, want in (("fp32", None), ("exp_avg", self.ck.exp_avg[name]),
                                ("exp_avg_sq", self.ck.exp_avg_sq[name])):
                rel = "zero/%s/%s.pt" % (name, state)
                self.assertIn(rel, listed)
                # ZeRO-3: the bare flat tensor DeepSpeed's ZeRO-3 loader reads.
                have = torch.load(os.path.join(out, rel), map_location="cpu")
                want = self.ck.expected[name] if want is None else want
                have = have.view(want.shape)
                self.assertTrue(torch.equal(have, want), rel)
        with open(os.path.join(saves, "latest_universal")) as f:
            self.assertEqual(f.read(), "global_step10_universal")

    def test_inspect_shows_the_description(self):
        doc = self.assertOk(self.ctl("inspect", self.save_dir, "--tag", self.TAG))
        self.assertEqual(doc["format"], "deepspeed-zero")
        self.assertEqual(doc["description"], self.DESCRIPTION)
        self.assertEqual([t["name"] for t in doc["tensors"]], list(self.ck.expected))
        self.assertEqual(len(doc["files"]), 8)
        local = run_ctl(["inspect", self.save_dir, "--tag", self.TAG])
        self.assertExit(local, 0)
        for key in ("format", "layout", "description", "tensors", "tensor_count", "total_bytes"):
            self.assertEqual(doc[key], local.doc[key], key)
        with_moments = self.assertOk(self.ctl("inspect", self.save_dir, "--tag", self.TAG,
                                              "--include-optimizer"))
        self.assertEqual(with_moments["description"], self.DESCRIPTION + ", with Adam moments")
        self.assertEqual(with_moments["tensor_count"],
                         len(self.ck.expected) + 2 * len(self.ck.exp_avg))
        # Without --tag, `latest` picks global_step20.
        latest = self.assertOk(self.ctl("inspect", self.save_dir))
        self.assertIn("ZeRO-2", latest["description"])
        self.assertIn("tag global_step20", latest["description"])

    def test_flipped_byte_fails_with_data_loss_unless_skip_crc_check(self):
        """A byte flipped in a stored record of an fp32 partition: the job fails DATA_LOSS
        naming the file and zip entry; --no-crc-check sends skip_crc_check and converts it."""
        import shutil
        import harness  # tests/harness.py: the zip byte-flipping helpers
        src = self.r("zero_run_flipped")
        shutil.copytree(self.save_dir, src)
        name = self.ck.optim_file(1)
        path = os.path.join(src, self.TAG, name)
        record = harness.corrupt_largest_record(path)
        out = self.r("out_flipped")
        # The largest record may hold Adam moments, which only --include-optimizer reads.
        r = self.ctl("consolidate", src, out, "--tag", self.TAG, "--include-optimizer",
                     "--no-progress")
        self.assertExit(r, 3)
        self.assertEqual(r.doc["state"], "failed", repr(r))
        error = r.doc["job"]["error"]
        self.assertEqual(error["code_name"], "DATA_LOSS", repr(r))
        for word in (name, 'zip entry "%s"' % record, 'tensor "', "CRC-32"):
            self.assertIn(word, error["message"], repr(r))
        self.assertNoOutput(out)
        self.assertNoStaging(out)
        unchecked = self.r("out_unchecked")
        doc = self.assertOk(self.ctl("consolidate", src, unchecked, "--tag", self.TAG,
                                     "--include-optimizer", "--no-crc-check", "--no-progress"))
        self.assertEqual(doc["state"], "succeeded")
        self.assertIs(doc["job"]["spec"]["skip_crc_check"], True)

    def test_tag_with_dotdot_refused(self):
        before = sorted(os.listdir(self.root))
        escape = "../../outside/secret_run/global_step1"
        for i, tag in enumerate(("..", "../zero_run", "global_step..10", escape)):
            out = self.r("out_dotdot%d" % i)
            r = self.ctl("consolidate", self.save_dir, out, "--tag", tag, "--no-progress")
            self.assertExit(r, 3)
            self.assertIsNotNone(r.doc, repr(r))
            self.assertIs(r.doc.get("ok"), False, repr(r))
            self.assertEqual(r.doc["exit_code"], 3, repr(r))
            if "job" in r.doc:
                # Accepted (a plain name to the daemon's spec check), then the reader refuses
                # the tag before opening anything: failed, nothing read or written.
                self.assertEqual(r.doc["state"], "failed", repr(r))
                error = r.doc["job"]["error"]
                self.assertEqual(error["code_name"], "INVALID_ARGUMENT", repr(r))
                self.assertEqual(int(r.doc["job"]["bytes_written"]), 0, repr(r))
            else:
                # A tag with a path separator is refused when the job is submitted.
                error = r.doc["error"]
                self.assertEqual(error["code"], "INVALID_ARGUMENT", repr(r))
            self.assertIn("folder name", error["message"], repr(r))
            self.assertNoOutput(out)
            self.assertNoStaging(out)
            self.assertError(self.ctl("inspect", self.save_dir, "--tag", tag), 3,
                             "INVALID_ARGUMENT", "folder name")
        self.assertEqual(sorted(os.listdir(self.root)), before)
        self.assertEqual(sorted(os.listdir(self.outside)), ["secret_run"])


if __name__ == "__main__":
    dh.main()
