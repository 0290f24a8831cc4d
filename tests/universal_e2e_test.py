"""End-to-end tests of reshard's DeepSpeed universal checkpoint reader against folders written
with real PyTorch by tests/fixtures/universal_fixture.py (a port of ds_to_universal.py) from
ZeRO checkpoints of tests/fixtures/zero_fixture.py.

Run:  /usr/bin/python3 tests/universal_e2e_test.py --reshardctl PATH [unittest args]
`reshardctl consolidate --include-optimizer` writes safetensors (read back with
tests/st_reference.py) and torch (read back with torch.load); every element of every tensor,
moments included, is compared with torch.equal against the original full tensors.
"""

import collections
import os
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import universal_fixture as uf  # noqa: E402
import zero_fixture as zf  # noqa: E402
from zero_e2e_test import Base  # noqa: E402

RESHARDCTL = None


class UniversalBase(Base):
    TMP_PREFIX = "reshard-universal"

    def convert(self, stage, world=3, frozen=True, module_fallback=False, name="save",
                tag="global_step10", version=0.2):
        """A ZeRO checkpoint at <name>/<tag> and its universal folder <name>/<tag>_universal."""
        model = uf.universal_model(frozen=frozen)
        ck = zf.write_zero_checkpoint(self.p(name), model, stage, world, tag=tag,
                                      half_dtype=torch.bfloat16,
                                      sub_group_size=100 if stage == 3 else None)
        uf.add_universal_checkpoint_info(ck, version)
        folder = uf.to_universal(ck, os.path.join(ck.save_dir, tag + "_universal"),
                                 module_fallback=module_fallback)
        return model, ck, folder

    def expected(self, model, ck, moments, strip_vocab, module_fp32=False):
        """name -> tensor in the reader's order: trainable params (param_shapes order), each
        followed by its moments when `moments`; the `module` tensors zero/ lacks (buffers,
        frozen params; float32 when ds_to_universal wrote them to zero/); tied aliases."""
        out = collections.OrderedDict()

        def cut(t):
            return t[:uf.ORIGINAL_VOCAB] if strip_vocab else t

        for name, t in model.trainable().items():
            fix = cut if name == "embed.weight" else (lambda x: x)
            out[name] = fix(t)
            if moments:
                out[name + ".exp_avg"] = fix(model.exp_avg[name])
                out[name + ".exp_avg_sq"] = fix(model.exp_avg_sq[name])
        for name in model.module_order:
            if name in model.buffers or name in model.frozen:
                t = ck.expected[name]
                out[name] = t.float() if module_fp32 else t
        for alias, owner in model.shared.items():
            # ds_to_universal's module fallback writes the alias's own 16-bit copy in `module`
            # (padded vocabulary rows and all) to zero/ as fp32: a tensor of its own.
            out[alias] = (model.trainable()[owner].to(torch.bfloat16).float() if module_fp32
                          else out[owner])
        return out


class UniversalConsolidateTests(UniversalBase):

    def test_zero2_from_parent_with_moments_every_element(self):
        model, ck, folder = self.convert(2)
        expected = self.expected(model, ck, moments=True, strip_vocab=True)
        for fmt in ("safetensors", "torch"):
            got = self.consolidate(ck.save_dir, fmt, "--include-optimizer")
            self.assertTensorsEqual(expected, got, fmt)
        doc = self.inspect(ck.save_dir, "--include-optimizer")
        self.assertEqual(doc["format"], "deepspeed-universal")
        self.assertEqual(doc["layout"], "sharded")
        self.assertEqual(
            doc["description"],
            "DeepSpeed universal checkpoint global_step10_universal, 10 parameters "
            "(universal_checkpoint_version 0.2), 5 tensors from mp_rank_00_model_states.pt module")
        self.assertEqual([t["name"] for t in doc["tensors"]], list(expected))
        # Without --include-optimizer: the model only.
        got = self.consolidate(folder, "safetensors")
        self.assertTensorsEqual(self.expected(model, ck, False, True), got, "no moments")

    def test_zero1_and_newer_module_fallback(self):
        # Newer ds_to_universal writes buffers and frozen params to zero/ as fp32 too.
        model, ck, folder = self.convert(1, world=2, module_fallback=True)
        expected = self.expected(model, ck, moments=False, strip_vocab=True, module_fp32=True)
        got = self.consolidate(folder, "safetensors")
        self.assertEqual(sorted(got), sorted(expected))
        self.assertTensorsEqual(expected, got, "fallback")

    def test_zero3_bare_tensors_shaped_from_param_shapes(self):
        model, ck, folder = self.convert(3, world=4, frozen=False)
        self.assertIsInstance(torch.load(os.path.join(folder, "zero", "embed.weight", "fp32.pt")),
                              torch.Tensor)
        expected = self.expected(model, ck, moments=True, strip_vocab=False)
        for fmt in ("safetensors", "torch"):
            got = self.consolidate(folder, fmt, "--include-optimizer")
            self.assertTensorsEqual(expected, got, fmt)
        # param_shapes order, not name order.
        doc = self.inspect(folder)
        self.assertEqual([t["name"] for t in doc["tensors"]][:3],
                         ["embed.weight", "layers.0.attn.qkv.weight", "layers.0.mlp.down.weight"])

    def test_zero3_frozen_params_refused(self):
        _, _, folder = self.convert(3, world=2, frozen=True)
        self.expect_rejected(folder, "embed.positions", "frozen_param_fragments")

    def test_tag_selects_another_universal_folder(self):
        model_a, ck_a, _ = self.convert(2, tag="global_step10")
        model_b, ck_b, _ = self.convert(2, world=2, tag="global_step20")  # latest_universal
        self.assertTensorsEqual(self.expected(model_b, ck_b, False, True),
                                self.consolidate(ck_a.save_dir))
        self.assertTensorsEqual(self.expected(model_a, ck_a, False, True),
                                self.consolidate(ck_a.save_dir, "safetensors", "--tag",
                                                 "global_step10_universal"))
        # The original ZeRO folder is still the ZeRO reader's.
        doc = self.inspect(ck_a.dir)
        self.assertEqual(doc["format"], "deepspeed-zero")


class UniversalRefusalTests(UniversalBase):

    def test_missing_and_malformed_files(self):
        _, _, folder = self.convert(2)
        fp32 = os.path.join(folder, "zero", "layers.0.ln.weight", "fp32.pt")
        torch.save({"cat_dim": 0}, fp32)
        self.expect_rejected(folder, fp32, "no 'param'")
        torch.save({"param": [1, 2]}, fp32)
        self.expect_rejected(folder, fp32, "not a tensor")
        os.remove(fp32)
        self.expect_rejected(folder, "layers.0.ln.weight has no fp32.pt")
        # The whole folder of a trainable param: refused, not replaced by its 16-bit copy.
        shutil.rmtree(os.path.dirname(fp32))
        self.expect_rejected(folder, "layers.0.ln.weight is missing")

    def test_moment_shape_mismatch(self):
        _, _, folder = self.convert(2)
        path = os.path.join(folder, "zero", "layers.0.attn.qkv.weight", "exp_avg.pt")
        torch.save({"cat_dim": 0, "param": torch.zeros(10, 30)}, path)
        self.expect_rejected(folder, path, "[10, 30]", "[30, 10]", extra=("--include-optimizer",))

    def test_flipped_data_byte_fails_the_crc(self):
        _, _, folder = self.convert(2)
        path = os.path.join(folder, "zero", "layers.1.mlp.down.weight", "fp32.pt")
        record = harness.corrupt_largest_record(path)
        out = self.p("out-crc")
        res = self.ctl("consolidate", folder, out, "--no-progress")
        self.assertExit(res, 3)
        for word in (path, 'zip entry "%s"' % record, "CRC-32"):
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))

if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
