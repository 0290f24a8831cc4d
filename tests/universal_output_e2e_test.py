"""End-to-end tests of DeepSpeed universal checkpoints (`--format deepspeed-universal`) against
real PyTorch: ZeRO-1/2/3 checkpoints written by tests/fixtures/zero_fixture.py from known full
tensors are consolidated into universal folders, which are then read with torch.load and
compared element by element with the originals, and sliced the way DeepSpeed's
`universal_checkpoint.py::load_hp_checkpoint_state` slices them for a new data-parallel size.

Run:  /usr/bin/python3 tests/universal_output_e2e_test.py --reshardctl PATH [unittest args]
"""

import filecmp
import math
import os
import sys
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import zero_fixture as zf  # noqa: E402

HALF = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}

# (stage, world, half, extra write_zero_checkpoint arguments)
SETUPS = [
    (1, 2, "fp32", {}),
    (1, 3, "bf16", {"bf16_optimizer": True}),
    (2, 3, "fp16", {}),
    (2, 8, "fp32", {}),
    (3, 3, "fp32", {"sub_group_size": 40}),  # several sub-groups; 1-element params on 3 ranks
    (3, 4, "bf16", {"sub_group_size": 1000}),
]


def load(path):
    return torch.load(path, map_location="cpu")


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-universal"
    TIMEOUT = 120

    def write(self, stage, world, half, seed=0, **kw):
        model = zf.small_model(seed=seed)
        return model, zf.write_zero_checkpoint(self.p("ckpt-%d-%d-%s" % (stage, world, half)),
                                               model, stage, world, half_dtype=HALF[half], **kw)

    def universal(self, src, name="global_step10_universal", *extra):
        out = self.p("saves", name)
        self.ok("consolidate", src, out, "--no-progress", "--format", "deepspeed-universal",
                *extra)
        return out


class UniversalOutputTests(Base):

    def check_folder(self, out, model, ck, what):
        trainable = model.trainable()
        zero = os.path.join(out, "zero")
        # One folder per trainable parameter: not frozen params, buffers or tied aliases.
        self.assertIn("optimizer_state.pt", os.listdir(zero), what)
        params = sorted(n for n in os.listdir(zero) if n != "optimizer_state.pt")
        self.assertEqual(params, sorted(trainable), what)
        for name, want in trainable.items():
            files = sorted(os.listdir(os.path.join(zero, name)))
            expect_files = ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt"]
            if ck.stage in (1, 2):
                expect_files.append("step.pt")  # ZeRO-3 keeps it in optimizer_state.pt
            self.assertEqual(files, sorted(expect_files), "%s %s" % (what, name))
            for state, expected in (("fp32", want), ("exp_avg", model.exp_avg[name]),
                                    ("exp_avg_sq", model.exp_avg_sq[name])):
                saved = load(os.path.join(zero, name, state + ".pt"))
                if ck.stage == 3:
                    # As ds_to_universal's ZeRO-3 path writes it and DeepSpeed's ZeRO-3 loader
                    # reads it (`torch.load(...).view(-1)`): the bare flat tensor.
                    self.assertTrue(torch.is_tensor(saved), "%s %s" % (what, name))
                    self.assertEqual(tuple(saved.shape), (expected.numel(),))
                    saved = {"param": saved.view(expected.shape)}
                else:
                    self.assertEqual(sorted(saved), ["cat_dim", "param"], "%s %s" % (what, name))
                    self.assertEqual(saved["cat_dim"], 0)
                have = saved["param"]
                self.assertEqual(have.dtype, torch.float32, "%s %s %s" % (what, name, state))
                self.assertEqual(tuple(have.shape), tuple(expected.shape),
                                 "%s %s %s" % (what, name, state))
                self.assertTrue(torch.equal(have, expected.float()),
                                "%s %s %s: values differ" % (what, name, state))
            if ck.stage in (1, 2):
                step = load(os.path.join(zero, name, "step.pt"))
                self.assertTrue(torch.equal(step, torch.tensor(10.0)), (what, name, step))
        # The model-states files, byte for byte.
        model_files = sorted(f for f in ck.files if f.endswith("_model_states.pt"))
        self.assertTrue(model_files)
        for f in model_files:
            self.assertTrue(filecmp.cmp(ck.path(f), os.path.join(out, f), shallow=False), f)
        # The optimizer's state without its partitions, loadable with the saving run's classes.
        optimizer = torch.load(os.path.join(zero, "optimizer_state.pt"), map_location="cpu")
        saved = torch.load(ck.path(ck.optim_file(0)), map_location="cpu")["optimizer_state_dict"]
        for gone in ("base_optimizer_state", "single_partition_of_fp32_groups",
                     "param_slice_mappings", "fp32_flat_groups"):
            self.assertNotIn(gone, optimizer, what)
        groups = (saved["base_optimizer_state"]["param_groups"] if ck.stage in (1, 2)
                  else saved["optimizer_state_dict"]["param_groups"])
        self.assertEqual(optimizer["param_groups"], groups, what)
        if ck.stage == 3:
            # What DeepSpeed's ZeRO-3 loader uses: the wrapped optimizer's param groups and each
            # sub-group's step (it fills state[0]'s moments from zero/ itself).
            nested = optimizer["optimizer_state_dict"]
            self.assertEqual(nested["param_groups"], groups, what)
            for sub_group, entry in saved["optimizer_state_dict"]["state"].items():
                self.assertEqual(sorted(nested["state"][sub_group]), ["step"], what)
                self.assertTrue(torch.equal(nested["state"][sub_group]["step"], entry["step"]))
        for key, value in saved.items():
            if key in ("base_optimizer_state", "single_partition_of_fp32_groups",
                       "param_slice_mappings", "fp32_flat_groups", "optimizer_state_dict"):
                continue
            if hasattr(value, "__dict__"):
                self.assertEqual(type(optimizer[key]).__name__, type(value).__name__, key)
                self.assertEqual(vars(optimizer[key]), vars(value), "%s %s" % (what, key))
            else:
                self.assertEqual(optimizer[key], value, "%s %s" % (what, key))
        top = sorted(n for n in os.listdir(out) if n != "reshard-manifest.json")
        self.assertEqual(top, sorted(model_files + ["zero"]), what)

    def test_every_zero_stage_bit_exact(self):
        for stage, world, half, kw in SETUPS:
            what = "ZeRO-%d x%d %s %s" % (stage, world, half, kw)
            with self.subTest(what):
                model, ck = self.write(stage, world, half, **kw)
                out = self.universal(ck.save_dir, "u-%d-%d-%s" % (stage, world, half),
                                     "--update-latest")
                self.check_folder(out, model, ck, what)
                with open(self.p("saves", "latest_universal")) as f:
                    self.assertEqual(f.read(), "u-%d-%d-%s" % (stage, world, half))

    def test_read_back_by_reshard(self):
        """The universal folder is an input too: consolidated to safetensors with the moments,
        it gives the fp32 weights and moments of the original (plus the buffers and frozen
        params of the copied model states)."""
        import st_reference as R
        from st_torch import tensor_from_st
        for stage, world, half, kw in SETUPS[:1] + SETUPS[2:3] + SETUPS[4:5]:
            with self.subTest(stage=stage):
                model, ck = self.write(stage, world, half, **kw)
                out = self.universal(ck.dir, "u%d" % stage)
                back = self.p("back%d" % stage)
                if stage == 3:
                    # ZeRO-3 keeps frozen params only in the original's frozen_param_fragments
                    # (DeepSpeed's universal loader does not read them either): refused.
                    res = self.ctl("consolidate", out, back, "--no-progress",
                                   "--include-optimizer")
                    self.assertExit(res, 3)
                    self.assertIn("frozen param", res.text)
                    continue
                self.ok("consolidate", out, back, "--no-progress", "--include-optimizer")
                got = {k: tensor_from_st(v) for k, v in R.read_folder(back).items()}
                for name, want in model.trainable().items():
                    self.assertTrue(torch.equal(got[name], want), name)
                    self.assertTrue(torch.equal(got[name + ".exp_avg"], model.exp_avg[name]))
                    self.assertTrue(torch.equal(got[name + ".exp_avg_sq"],
                                                model.exp_avg_sq[name]))

    def test_reshard_a_universal_checkpoint(self):
        """A universal folder split into 2 tensor-parallel parts with rules: each part holds
        its slice of the fp32 master weights (and moments), the rest replicated."""
        import json
        import st_reference as R
        from st_torch import tensor_from_st
        model, ck = self.write(2, 3, "fp32")
        out = self.universal(ck.dir)
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": r"(attn\.qkv|mlp\.down)\.weight", "split_dim": 0},
                                 {"pattern": ".*", "replicate": True}]}, f)
        parts = self.p("parts")
        self.ok("reshard", out, parts, "--parts", "2", "--rules", rules, "--no-progress",
                "--include-optimizer")
        for rank in range(2):
            got = {k: tensor_from_st(v) for k, v in R.read_file(
                os.path.join(parts, "model_part-%d.safetensors" % rank)).items()}
            for name, want in model.trainable().items():
                for suffix, full in (("", want), (".exp_avg", model.exp_avg[name]),
                                     (".exp_avg_sq", model.exp_avg_sq[name])):
                    split = "attn.qkv.weight" in name or "mlp.down.weight" in name
                    expect = full.chunk(2, 0)[rank] if split else full
                    self.assertTrue(torch.equal(got[name + suffix], expect), (rank, name, suffix))

    def test_latest_universal_only_when_asked(self):
        model, ck = self.write(2, 2, "fp32")
        self.universal(ck.dir)
        self.assertFalse(os.path.exists(self.p("saves", "latest_universal")))

    def test_reload_for_new_data_parallel_sizes(self):
        """Slices the universal files the way DeepSpeed does when it resumes at another DP size
        (ZeRO-1/2: the group's flat buffer, aligned and partitioned; ZeRO-3: each param padded
        to W * ceil(n / W)), and compares every rank's fragment with the same fragment built from
        the original tensors."""
        model, ck = self.write(2, 3, "fp32")
        out = self.universal(ck.dir)
        for state, originals in (("fp32", model.trainable()), ("exp_avg", model.exp_avg),
                                 ("exp_avg_sq", model.exp_avg_sq)):
            loaded = {n: load(os.path.join(out, "zero", n, state + ".pt"))["param"]
                      for n in model.trainable()}
            for new_world in (1, 2, 5, 8):
                for group in model.groups:
                    flat_new = torch.cat([loaded[n].reshape(-1) for n in group])
                    flat_old = torch.cat([originals[n].reshape(-1) for n in group])
                    align = 2 * new_world
                    padded = math.ceil(flat_old.numel() / align) * align
                    part = padded // new_world
                    for rank in range(new_world):
                        begin = min(rank * part, flat_old.numel())
                        end = min((rank + 1) * part, flat_old.numel())
                        self.assertTrue(torch.equal(flat_new[begin:end], flat_old[begin:end]),
                                        (state, new_world, rank))
                for name, t in originals.items():  # ZeRO-3 partitioning of each param
                    numel = t.numel()
                    part = math.ceil(numel / new_world)
                    pad_new = torch.nn.functional.pad(loaded[name].reshape(-1),
                                                      (0, part * new_world - numel))
                    pad_old = torch.nn.functional.pad(t.reshape(-1), (0, part * new_world - numel))
                    for rank in range(new_world):
                        self.assertTrue(torch.equal(pad_new[rank * part:(rank + 1) * part],
                                                    pad_old[rank * part:(rank + 1) * part]))

    def test_zero3_loader_slices_for_new_data_parallel_sizes(self):
        """DeepSpeed's ZeRO-3 universal loader (stage3.py: torch.load(...).view(-1), padded to
        W * ceil(n / W), rank r's slice) on reshard's ZeRO-3 output equals the same slices of
        the original tensors, for every new world size."""
        model, ck = self.write(3, 3, "fp32", sub_group_size=40)
        out = self.universal(ck.dir)
        for state, originals in (("fp32", model.trainable()), ("exp_avg", model.exp_avg),
                                 ("exp_avg_sq", model.exp_avg_sq)):
            for name, t in originals.items():
                flat = load(os.path.join(out, "zero", name, state + ".pt")).view(-1)
                for world in (1, 2, 3, 5):
                    part = math.ceil(flat.numel() / world)
                    padded = torch.cat([flat, torch.zeros(world * part - flat.numel())])
                    want = torch.cat([t.reshape(-1), torch.zeros(world * part - t.numel())])
                    for rank in range(world):
                        self.assertTrue(torch.equal(padded.narrow(0, rank * part, part),
                                                    want.narrow(0, rank * part, part)),
                                        (state, name, world, rank))

    def test_refusals(self):
        """Refused before anything is written, each with the reason: another dtype, a reshard
        (a universal checkpoint holds whole tensors), an input without optimizer moments."""
        import json
        model, ck = self.write(1, 2, "fp32")
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": ".*", "replicate": True}]}, f)
        out = self.p("refused")
        stage0 = zf.write_stage0_checkpoint(self.p("stage0"), zf.small_model())
        for command, phrase in (
                (("consolidate", ck.dir, out, "--dtype", "bf16"), "--dtype must be keep or fp32"),
                (("reshard", ck.dir, out, "--parts", "2", "--rules", rules),
                 "written by `consolidate`"),
                (("consolidate", stage0.dir, out),
                 "--format deepspeed-universal reads the optimizer's Adam moments")):
            with self.subTest(command=command[0], phrase=phrase):
                res = self.ctl(*command, "--no-progress", "--format", "deepspeed-universal")
                self.assertExit(res, 3)
                self.assertIn(phrase, res.text)
                self.assertFalse(os.path.exists(out))

    def test_plan_lists_the_files(self):
        model, ck = self.write(3, 2, "fp32")
        res = self.ok("plan", ck.dir, "--format", "deepspeed-universal", "--json")
        import json
        doc = json.loads(res.stdout.decode())
        names = [f["name"] for f in doc["files"]]
        for name in model.trainable():
            for state in ("fp32", "exp_avg", "exp_avg_sq"):
                self.assertIn("zero/%s/%s.pt" % (name, state), names)
        self.assertIn("zero_pp_rank_0_mp_rank_00_model_states.pt", names)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
