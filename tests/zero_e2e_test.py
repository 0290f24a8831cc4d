"""End-to-end tests of reshard's DeepSpeed ZeRO-1/2/3 reader against checkpoints written with real
PyTorch by tests/fixtures/zero_fixture.py (DeepSpeed's layout, from known full tensors).

Run:  /usr/bin/python3 tests/zero_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]
`reshardctl consolidate` writes safetensors (read back with tests/st_reference.py) and torch
(read back with torch.load); every tensor is compared with torch.equal against the originals.
Broken checkpoints must exit 3 with a message naming what is wrong, and never create OUT.
"""

import collections
import json
import os
import shutil
import sys
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402
import st_reference as R  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import zero_fixture as zf  # noqa: E402
from st_torch import tensor_from_st  # noqa: E402

RESHARDCTL = None

HALF = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def zero_to_fp32_reference(ckpt_dir):
    """zero_to_fp32's algorithm (§1.7) with torch.load, for checking the fixture itself:
    buffers (not cast), frozen params (stage >= 2), trainable params, aliases."""
    names = sorted(os.listdir(ckpt_dir))
    optim = sorted((n for n in names if n.endswith("_optim_states.pt")),
                   key=lambda n: int(n.split("zero_pp_rank_")[1].split("_")[0]))
    osd = [torch.load(os.path.join(ckpt_dir, n))["optimizer_state_dict"] for n in optim]
    stage = int(osd[0].get("zero_stage", 1))
    pc = osd[0]["partition_count"]
    world = max(pc) if isinstance(pc, list) else pc
    assert len(optim) == world
    if stage == 3:
        models = [torch.load(os.path.join(ckpt_dir, "zero_pp_rank_%d_mp_rank_00_model_states.pt"
                                          % r)) for r in range(world)]
    else:
        models = [torch.load(os.path.join(ckpt_dir, "mp_rank_00_model_states.pt"))]
    m0 = models[0]
    sd = collections.OrderedDict()
    for k, v in m0["module"].items():
        if k in m0["buffer_names"]:
            sd[k] = v
    if m0.get("frozen_param_shapes"):
        for name, shape in m0["frozen_param_shapes"].items():
            n = shape.numel()
            if stage == 3:
                frags = [m["frozen_param_fragments"][name] for m in models]
                sd[name] = torch.cat(frags, 0).narrow(0, 0, n).view(shape)
            else:
                sd[name] = m0["frozen_param_fragments"][name]
    if stage == 3:
        flat_groups = [o["fp32_flat_groups"] for o in osd]
        sizes = [g.numel() for g in flat_groups[0]]
        merged = torch.cat([torch.cat(list(g)) for g in flat_groups])  # rank-major
        per_rank = sum(sizes)
        offset = 0
        for shapes in m0["param_shapes"]:
            for name, shape in shapes.items():
                n = shape.numel()
                p = (n + world - 1) // world
                parts = [merged[r * per_rank + offset:r * per_rank + offset + p]
                         for r in range(world)]
                sd[name] = torch.cat(parts).narrow(0, 0, n).view(shape)
                offset += p
        assert offset * world == world * per_rank
    else:
        for g, shapes in enumerate(m0["param_shapes"]):
            full = torch.cat([o["single_partition_of_fp32_groups"][g] for o in osd])
            offset = 0
            for name, shape in shapes.items():
                n = shape.numel()
                sd[name] = full.narrow(0, offset, n).view(shape)
                offset += n
            align = 2 * world
            assert (offset + align - 1) // align == (full.numel() + align - 1) // align
    for alias, owner in m0["shared_params"].items():
        if owner in sd:
            sd[alias] = sd[owner]
    return sd


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-zero"
    TIMEOUT = 120

    def write(self, stage, world, half="fp32", seed=0, name="ckpt", model=None, **kw):
        model = model or zf.small_model(seed=seed)
        kw.setdefault("sub_group_size", 40 if stage == 3 else None)
        return zf.write_zero_checkpoint(self.p(name), model, stage, world,
                                        half_dtype=HALF[half], **kw)

    def write0(self, half="fp32", models=None, seed=0, name="ckpt", **kw):
        """DeepSpeed without ZeRO (stage 0)."""
        models = models or zf.small_model(seed=seed)
        return zf.write_stage0_checkpoint(self.p(name), models, half_dtype=HALF[half], **kw)

    def remove_optimizer_files(self, ck):
        removed = [f for f in ck.files if f.endswith("_optim_states.pt")]
        self.assertTrue(removed)
        for f in removed:
            os.remove(ck.path(f))
        return removed

    def consolidate(self, src, fmt="safetensors", *extra, out_name=None):
        """Runs consolidate and reads the output back: name -> torch tensor (aliases resolved)."""
        out = self.p(out_name or "out-%s-%d" % (fmt, len(os.listdir(self.tmp))))
        self.ok("consolidate", src, out, "--no-progress", "--format", fmt, *extra)
        if fmt == "torch":
            files = sorted(f for f in os.listdir(out) if f.endswith(".bin"))
            self.assertEqual(files, ["pytorch_model.bin"], os.listdir(out))
            return collections.OrderedDict(
                torch.load(os.path.join(out, "pytorch_model.bin"), map_location="cpu"))
        got = collections.OrderedDict((k, tensor_from_st(v)) for k, v in R.read_folder(out).items())
        for name in sorted(os.listdir(out)):
            if name.endswith(".safetensors"):
                meta = R.read_file(os.path.join(out, name), with_metadata=True)[1] or {}
                for alias, kept in meta.items():
                    if kept in got and alias not in got:
                        got[alias] = got[kept]
        return got

    def assertTensorsEqual(self, expected, got, what=""):
        self.assertEqual(sorted(expected), sorted(got), what)
        for name, want in expected.items():
            have = got[name]
            self.assertEqual(have.dtype, want.dtype, "%s %s" % (what, name))
            self.assertEqual(tuple(have.shape), tuple(want.shape), "%s %s" % (what, name))
            self.assertTrue(torch.equal(have, want), "%s %s: values differ" % (what, name))

    def inspect(self, src, *extra):
        res = self.ok("inspect", src, "--json", *extra)
        return json.loads(res.stdout.decode())

    def expect_rejected(self, src, *phrases, extra=()):
        """Exit 3 with every phrase in the message, OUT never created; inspect agrees."""
        out = self.p("out-rejected")
        res = self.ctl("consolidate", src, out, "--no-progress", *extra)
        self.assertExit(res, 3)
        for phrase in phrases:
            self.assertIn(phrase, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        res2 = self.ctl("inspect", src, "--json", *extra)
        self.assertExit(res2, 3)
        doc = json.loads(res2.stdout.decode())
        self.assertFalse(doc["ok"])
        for phrase in phrases:
            self.assertIn(phrase, doc["error"]["message"], doc)
        return res.text


class ZeroFixtureTests(Base):
    """The fixture agrees with zero_to_fp32's algorithm run with torch.load."""

    def test_fixture_matches_zero_to_fp32_algorithm(self):
        for stage in (1, 2, 3):
            for world in (1, 3, 8):
                ck = self.write(stage, world, "bf16", name="s%dw%d" % (stage, world))
                ref = zero_to_fp32_reference(ck.dir)
                expected = collections.OrderedDict(ck.expected)
                if stage == 1:  # zero_to_fp32 has no frozen params for ZeRO-1
                    for name in zf.small_model().frozen:
                        expected.pop(name)
                self.assertEqual(list(ref), list(expected), (stage, world))
                self.assertTensorsEqual(expected, ref, "stage %d world %d" % (stage, world))

    def test_fixture_file_names_and_keys(self):
        ck = self.write(3, 2, "bf16")
        self.assertEqual(sorted(os.listdir(ck.dir)), [
            "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "zero_pp_rank_0_mp_rank_00_model_states.pt",
            "zero_pp_rank_1_mp_rank_00_model_states.pt"])
        with open(os.path.join(ck.save_dir, "latest")) as f:
            self.assertEqual(f.read(), "global_step10")
        optim = torch.load(ck.path(ck.optim_file(1)))["optimizer_state_dict"]
        self.assertEqual(type(optim["zero_stage"]).__module__, "deepspeed.runtime.zero.config")
        self.assertEqual(int(optim["zero_stage"]), 3)
        self.assertEqual(optim["partition_count"], 2)
        self.assertIn("exp_avg", optim["optimizer_state_dict"]["state"][0])
        model = torch.load(ck.path(ck.model_file(1)))
        self.assertEqual(model["shared_params"], {})
        self.assertEqual(tuple(model["module"]["embed.weight"].shape), (0,))
        # fp32_flat_groups pickle through _rebuild_from_type_v2 (with ds_id), as torch >= 2 does.
        import zipfile
        with zipfile.ZipFile(ck.path(ck.optim_file(0))) as z:
            pkl = z.read([n for n in z.namelist() if n.endswith("data.pkl")][0])
        self.assertIn(b"_rebuild_from_type_v2", pkl)
        self.assertIn(b"ds_id", pkl)
        ck12 = self.write(2, 2, "fp16", name="z2")
        optim = torch.load(ck12.path(ck12.optim_file(0)))["optimizer_state_dict"]
        self.assertEqual(int(optim["zero_stage"]), 2)
        self.assertEqual(optim["partition_count"], [2, 2, 2])
        self.assertEqual(type(optim["param_slice_mappings"][0]["embed.weight"]).__module__,
                         "deepspeed.utils.tensor_fragment")
        model = torch.load(ck12.path("mp_rank_00_model_states.pt"))
        views = [model["module"][n] for n in zf.small_model().groups[0]]
        self.assertTrue(all(v.storage().data_ptr() == views[0].storage().data_ptr()
                            for v in views), "16-bit params are not views of one flat buffer")


    def test_stage0_fixture_layout(self):
        # DeepSpeed without ZeRO: one model-states file, ZeRO keys None, `module` the state dict.
        ck = self.write0("fp16", name="s0")
        self.assertEqual(sorted(os.listdir(ck.dir)), ["mp_rank_00_model_states.pt"])
        states = torch.load(ck.path(ck.model_file()))
        for key in ("param_shapes", "frozen_param_shapes", "frozen_param_fragments",
                    "shared_params"):
            self.assertIsNone(states[key], key)
        self.assertEqual(states["ds_config"]["zero_optimization"], {"stage": 0})
        self.assertEqual(list(states["module"]), list(ck.expected))
        self.assertTensorsEqual(ck.expected, states["module"])
        # FP16_Optimizer: the trainable params of a group are views of one flat fp16 buffer.
        views = [states["module"][n] for n in zf.small_model().groups[0]]
        self.assertTrue(all(v.storage().data_ptr() == views[0].storage().data_ptr()
                            for v in views), "fp16 params are not views of one flat buffer")
        self.assertEqual(len(states["optimizer"]["fp32_groups_flat"]), 3)
        self.assertEqual(states["module"]["lm_head.weight"].data_ptr(),
                         states["module"]["embed.weight"].data_ptr())


def _matrix_test(stage, world):
    # The 16-bit dtype varies with the world size so every stage meets all three.
    half = {1: "fp32", 2: "fp16", 3: "bf16", 8: "bf16"}[world]

    def test(self):
        ck = self.write(stage, world, half, seed=stage * 10 + world)
        # The parent folder (its `latest` names the tag) to safetensors, the tag folder to torch.
        got = self.consolidate(ck.save_dir, "safetensors")
        self.assertTensorsEqual(ck.expected, got, "safetensors")
        got = self.consolidate(ck.dir, "torch")
        self.assertTensorsEqual(ck.expected, got, "torch")
        self.assertEqual(got["lm_head.weight"].data_ptr(), got["embed.weight"].data_ptr(),
                         "tied alias not stored once")
    test.__name__ = "test_stage%d_world%d_%s" % (stage, world, half)
    return test


class ZeroConsolidateTests(Base):

    def test_bounded_memory_on_a_320_mib_checkpoint(self):
        # ZeRO-3, 4 ranks, bf16 run: 320 MiB of fp32 partitions gathered into one model; peak
        # RSS under harness.MAX_CONVERSION_RSS.
        total = 320 << 20
        ck = zf.write_benchmark_checkpoint(self.p("big"), total, stage=3, world_size=4,
                                           num_params=32)
        params = sum(t.numel() for t in ck.expected.values() if t.is_floating_point())
        out = self.p("out-big")
        harness.assert_bounded_rss(self, [harness.BINARIES["reshardctl"], "consolidate", ck.dir,
                                          out, "--no-progress"], params * 4)
        doc = self.inspect_json(out)
        self.assertEqual(doc["tensor_count"], len(ck.expected))
    pass


for _stage in (1, 2, 3):
    for _world in (1, 2, 3, 8):
        _t = _matrix_test(_stage, _world)
        setattr(ZeroConsolidateTests, _t.__name__, _t)


class ZeroOptionsTests(Base):

    def test_inspect_json_order_and_description(self):
        ck = self.write(3, 4, "bf16")
        doc = self.inspect(ck.save_dir)
        self.assertEqual(doc["format"], "deepspeed-zero")
        self.assertEqual(
            doc["description"],
            "DeepSpeed ZeRO-3 (bf16), 4 data-parallel ranks, tag global_step10, "
            "20 parameters (2 frozen, 1 shared), 5 buffers")
        self.assertEqual([t["name"] for t in doc["tensors"]], list(ck.expected))
        self.assertEqual(len(doc["files"]), 8)
        for t in doc["tensors"]:
            want = ck.expected[t["name"]]
            self.assertEqual(t["shape"], list(want.shape), t)

    def test_dtype_bf16_rounds_like_torch(self):
        for stage in (2, 3):
            ck = self.write(stage, 3, "fp16", name="c%d" % stage)
            expected = collections.OrderedDict(
                (k, v.to(torch.bfloat16) if v.is_floating_point() else v)
                for k, v in ck.expected.items())
            got = self.consolidate(ck.dir, "safetensors", "--dtype", "bf16")
            self.assertTensorsEqual(expected, got, "bf16 stage %d" % stage)

    def test_include_optimizer_moments(self):
        for stage in (1, 2, 3):
            ck = self.write(stage, 3, "bf16", name="c%d" % stage)
            expected = collections.OrderedDict(ck.expected)
            for name in ck.exp_avg:
                expected[name + ".exp_avg"] = ck.exp_avg[name]
                expected[name + ".exp_avg_sq"] = ck.exp_avg_sq[name]
            got = self.consolidate(ck.dir, "safetensors", "--include-optimizer")
            self.assertTensorsEqual(expected, got, "moments stage %d" % stage)
            doc = self.inspect(ck.dir, "--include-optimizer")
            self.assertTrue(doc["description"].endswith("with Adam moments"), doc["description"])

    def test_include_optimizer_refused_without_moments(self):
        model = zf.small_model(with_moments=False)
        for stage in (2, 3):
            ck = self.write(stage, 2, model=model, name="c%d" % stage)
            self.expect_rejected(ck.dir, "--include-optimizer", "exp_avg",
                                 ck.optim_file(0), extra=("--include-optimizer",))
            # Without the flag it reads fine.
            self.assertTensorsEqual(ck.expected, self.consolidate(ck.dir))

    def test_tag_selects_between_two_checkpoints(self):
        a = self.write(2, 2, seed=1, tag="global_step10")
        b = self.write(3, 3, seed=2, tag="global_step20")  # `latest` now names global_step20
        self.assertTensorsEqual(b.expected, self.consolidate(a.save_dir))
        self.assertTensorsEqual(a.expected,
                                self.consolidate(a.save_dir, "safetensors", "--tag",
                                                 "global_step10"))
        doc = self.inspect(a.save_dir, "--tag", "global_step10")
        self.assertIn("ZeRO-2", doc["description"])
        self.assertIn("tag global_step10", doc["description"])
        self.expect_rejected(a.save_dir, "global_step99", "global_step10, global_step20",
                             extra=("--tag", "global_step99"))
        self.expect_rejected(a.save_dir, "not a plain folder name", extra=("--tag", "../x"))

    def test_parent_without_latest_lists_tags(self):
        a = self.write(1, 2, tag="global_step5", save_latest=False)
        self.write(1, 2, tag="global_step7", save_latest=False)
        self.expect_rejected(a.save_dir, "no `latest` file", "global_step5, global_step7",
                             "--tag")
        self.assertTensorsEqual(a.expected,
                                self.consolidate(a.save_dir, "safetensors", "--tag",
                                                 "global_step5"))

    def test_bf16_optimizer_files_read_as_stage1(self):
        ck = self.write(1, 3, bf16_optimizer=True)
        doc = self.inspect(ck.dir)
        self.assertIn("BF16_Optimizer (ZeRO-1 layout), 3 data-parallel ranks", doc["description"])
        self.assertTensorsEqual(ck.expected, self.consolidate(ck.dir))
        expected = collections.OrderedDict(ck.expected)
        for name in ck.exp_avg:
            expected[name + ".exp_avg"] = ck.exp_avg[name]
            expected[name + ".exp_avg_sq"] = ck.exp_avg_sq[name]
        self.assertTensorsEqual(expected,
                                self.consolidate(ck.dir, "torch", "--include-optimizer"))

    def test_pickle_variants(self):
        # ZeroStageEnum by value (Python <= 3.10) and by name (3.11); flat groups as torch 1.13
        # writes them (attributes dropped) and as torch >= 2 does (_rebuild_from_type_v2).
        for i, (how, emulate) in enumerate([("by_value", False), ("by_name", True),
                                            ("by_value", True)]):
            for stage in (2, 3):
                ck = self.write(stage, 3, "bf16", name="v%d-%d" % (i, stage),
                                zero_stage_pickle=how, emulate_rebuild_from_type=emulate)
                self.assertTensorsEqual(ck.expected, self.consolidate(ck.dir),
                                        "%s %s stage %d" % (how, emulate, stage))

    def test_one_sub_group_per_param_group_and_verify(self):
        ck = self.write(3, 8, "bf16", sub_group_size=None)
        got = self.consolidate(ck.dir, "safetensors", out_name="out")
        self.assertTensorsEqual(ck.expected, got)
        res = self.ok("verify", ck.dir, self.p("out"), "--json")
        self.assertTrue(json.loads(res.stdout.decode())["equal"], res.text)


def tp_model_parts(parts, seed=3):
    """A small model and its `parts` tensor-parallel shards (Megatron-like: embeddings and qkv
    split on rows, the attention output on columns, norms and buffers replicated), with the
    rules that merge them. Returns (full tensors in module order, [ZeroModel per rank], rules)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(tuple(shape), generator=g)

    full = collections.OrderedDict([
        ("embed.weight", randn(38, 10)),
        ("layers.0.ln.weight", 1 + 0.1 * randn(10)),
        ("layers.0.qkv.weight", randn(30, 10)),
        ("layers.0.qkv.bias", randn(30)),
        ("layers.0.dense.weight", randn(10, 30)),
        ("layers.0.rotary.inv_freq", 1.0 / (10000 ** (torch.arange(0, 10, 2) / 10))),
    ])
    split = {"embed.weight": 0, "layers.0.qkv.weight": 0, "layers.0.qkv.bias": 0,
             "layers.0.dense.weight": 1}
    models = []
    for r in range(parts):
        params, buffers = collections.OrderedDict(), collections.OrderedDict()
        for name, t in full.items():
            piece = t.chunk(parts, split[name])[r].clone() if name in split else t.clone()
            (buffers if name.endswith("inv_freq") else params)[name] = piece
        models.append(zf.ZeroModel([params], buffers=buffers, module_order=list(full)))
    rules = {"rules": [
        {"pattern": r"(embed|qkv)\.(weight|bias)$", "split_dim": 0},
        {"pattern": r"dense\.weight$", "split_dim": 1},
        {"pattern": r".*", "replicate": True},
    ]}
    return full, models, rules


class ZeroStage0Tests(Base):
    """DeepSpeed without ZeRO: the weights are `module` of mp_rank_XX_model_states.pt."""

    def test_stage0_consolidates_the_module_exactly(self):
        for half in ("fp32", "fp16"):
            ck = self.write0(half, seed=4, name="s0-" + half)
            self.assertEqual(ck.files, ["mp_rank_00_model_states.pt"])
            want_dtype = torch.float16 if half == "fp16" else torch.float32
            self.assertEqual(ck.expected["embed.weight"].dtype, want_dtype)
            got = self.consolidate(ck.save_dir, "safetensors")
            self.assertTensorsEqual(ck.expected, got, "safetensors " + half)
            got = self.consolidate(ck.dir, "torch")
            self.assertTensorsEqual(ck.expected, got, "torch " + half)
            self.assertEqual(got["lm_head.weight"].data_ptr(), got["embed.weight"].data_ptr(),
                             "tied weight not stored once")
            # Nothing of the file beyond `module`: no module.* names, no optimizer tensors.
            self.assertFalse([n for n in got if n.startswith(("module.", "optimizer."))], got)

    def test_stage0_inspect(self):
        ck = self.write0("fp16", zero_config=False)
        for src in (ck.save_dir, ck.dir):
            doc = self.inspect(src)
            self.assertEqual(doc["format"], "deepspeed-zero")
            self.assertEqual(doc["layout"], "single-file")
            self.assertEqual(
                doc["description"],
                "DeepSpeed (no ZeRO), weights from mp_rank_00_model_states.pt module, tag "
                "global_step10, %d tensors" % len(ck.expected))
            self.assertEqual([t["name"] for t in doc["tensors"]], list(ck.expected))
            for t in doc["tensors"]:
                self.assertEqual(t["shape"], list(ck.expected[t["name"]].shape), t)
            self.assertEqual(len(doc["files"]), 1)
        # --dtype converts like torch.
        expected = collections.OrderedDict(
            (k, v.to(torch.bfloat16) if v.is_floating_point() else v)
            for k, v in ck.expected.items())
        self.assertTensorsEqual(expected, self.consolidate(ck.dir, "safetensors", "--dtype",
                                                           "bf16"))

    def test_stage0_tensor_parallel_ranks_are_parts(self):
        full, models, rules = tp_model_parts(2)
        ck = self.write0(models=models)
        self.assertEqual(ck.files, ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"])
        rules_path = self.p("rules.json")
        with open(rules_path, "w") as f:
            json.dump(rules, f)
        doc = self.inspect(ck.dir)
        self.assertEqual(doc["layout"], "model-parallel-parts")
        self.assertEqual(doc["parts"], 2)
        self.assertIn("2 model-parallel parts", doc["description"])
        got = self.consolidate(ck.save_dir, "safetensors", "--rules", rules_path)
        self.assertTensorsEqual(full, got, "merged")
        # Without rules: consolidate is refused, naming the parts and --rules (inspect shows
        # the parts unmerged, above).
        out = self.p("out-norules")
        res = self.ctl("consolidate", ck.dir, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("2 model-parallel parts", res.text)
        self.assertIn("--rules", res.text)
        self.assertFalse(os.path.exists(out))

    def test_stage0_include_optimizer_refused(self):
        ck = self.write0()
        self.expect_rejected(ck.dir, "--include-optimizer", "keyed by parameter index",
                             extra=("--include-optimizer",))


class ZeroCrcTests(Base):

    def test_flipped_byte_in_an_fp32_partition_is_data_loss(self):
        """One byte flipped in a stored record of a rank's optimizer states file (its fp32 flat
        partition): exit 3 naming the file, zip entry and a tensor read from it."""
        ck = self.write(3, 2, model=zf.small_model(seed=4, with_moments=False))
        self.assertTensorsEqual(ck.expected, self.consolidate(ck.save_dir), "intact")
        name = ck.optim_file(1)
        path = ck.path(name)
        record = harness.corrupt_largest_record(path)
        out = self.p("out-crc")
        res = self.ctl("consolidate", ck.save_dir, out, "--no-progress")
        self.assertExit(res, 3)
        for word in (name, 'zip entry "%s"' % record, 'tensor "', "CRC-32"):
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))


class ZeroRefusalTests(Base):

    def test_zero_without_optimizer_files(self):
        # The optimizer files were not copied: the model states say ZeRO (zero_pp_rank names,
        # ds_config's stage, param_shapes), so the fp32 weights are missing.
        cases = [(1, 2, "fp32", {}), (2, 3, "fp16", {}), (3, 2, "fp32", {}), (3, 4, "bf16", {}),
                 (1, 2, "bf16", {"bf16_optimizer": True})]
        for i, (stage, world, half, kw) in enumerate(cases):
            ck = self.write(stage, world, half, name="c%d" % i, **kw)
            self.remove_optimizer_files(ck)
            message = ("DeepSpeed ZeRO-%d checkpoint global_step10 has no optimizer files "
                       "(%szero_pp_rank_*_mp_rank_00_optim_states.pt): the fp32 weights live "
                       "there; copy them too" % (stage, "bf16_" if half == "bf16" else ""))
            for src in (ck.save_dir, ck.dir):
                self.expect_rejected(src, message)
                self.expect_rejected(src, message, extra=("--include-optimizer",))
            self.expect_rejected(ck.save_dir, message, extra=("--tag", "global_step10"))

    def test_zero_without_optimizer_files_nor_zero_config(self):
        # An older save without ds_config: param_shapes alone says ZeRO.
        ck = self.write(2, 2, name="noconfig")
        self.remove_optimizer_files(ck)
        self._rewrite(ck.path(ck.model_file()), lambda m: m.pop("ds_config"))
        self.expect_rejected(ck.dir, "DeepSpeed ZeRO checkpoint global_step10 has no optimizer "
                             "files (zero_pp_rank_*_mp_rank_00_optim_states.pt)")

    def test_stage0_missing_model_parallel_rank(self):
        _, models, _ = tp_model_parts(3)
        ck = self.write0(models=models)
        os.rename(ck.path(ck.model_file(2)), self.p("rank2.pt"))
        self.expect_rejected(ck.dir, "mp_world_size is 3, but the folder holds 2")
        os.rename(self.p("rank2.pt"), ck.path(ck.model_file(2)))
        os.remove(ck.path(ck.model_file(1)))
        self.expect_rejected(ck.dir, "mp_rank_01_model_states.pt is missing")

    def test_pipeline_model_states_without_layer_files(self):
        # The pipeline engine saves `module` None; its weights are the layer files.
        ck = self.write0()
        self._rewrite(ck.path(ck.model_file()), lambda m: m.__setitem__("module", None))
        self.expect_rejected(ck.dir, "`module` is None", "layer_XX-model_YY-model_states.pt")

    def test_missing_optimizer_file_of_rank_2_of_4(self):
        ck = self.write(3, 4)
        os.remove(ck.path(ck.optim_file(2)))
        self.expect_rejected(
            ck.save_dir,
            "ZeRO-3 with 4 ranks: rank 2's optimizer file "
            "(zero_pp_rank_2_mp_rank_00_optim_states.pt) is missing", "partial save")

    def test_missing_model_states_file_stage3(self):
        ck = self.write(3, 4, "bf16")
        os.remove(ck.path("zero_pp_rank_1_mp_rank_00_model_states.pt"))
        self.expect_rejected(
            ck.dir, "rank 1's model-states file (zero_pp_rank_1_mp_rank_00_model_states.pt) "
            "is missing", "partial save")

    def test_missing_model_states_file_stage2(self):
        ck = self.write(2, 2)
        os.remove(ck.path("mp_rank_00_model_states.pt"))
        self.expect_rejected(ck.dir, "ZeRO-2 with 2 ranks",
                             "model-states file (mp_rank_00_model_states.pt) is missing")

    def test_missing_rank_0(self):
        ck = self.write(2, 3, "bf16")
        os.remove(ck.path(ck.optim_file(0)))
        self.expect_rejected(ck.dir, "rank 0's optimizer file "
                             "(bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt) is missing")

    def test_truncated_optimizer_file(self):
        ck = self.write(3, 2)
        path = ck.path(ck.optim_file(1))
        with open(path, "rb") as f:
            data = f.read()
        for cut in (len(data) // 2, len(data) - 30, 100):
            with open(path, "wb") as f:
                f.write(data[:cut])
            self.expect_rejected(ck.dir, ck.optim_file(1))

    def test_world_size_mismatch(self):
        # partition_count says 4, three files.
        ck = self.write(2, 4)
        os.remove(ck.path(ck.optim_file(3)))
        self.expect_rejected(ck.dir, "ZeRO-2 with 4 ranks: rank 3's optimizer file",
                             "(3 optimizer files found)")
        # partition_count says 3, four files (rank 3's from another run).
        small = self.write(2, 3, name="small")
        shutil.copy(ck.path(ck.optim_file(0)),
                    small.path("zero_pp_rank_3_mp_rank_00_optim_states.pt"))
        self.expect_rejected(small.dir, "ZeRO-2 with 3 ranks",
                             "zero_pp_rank_3_mp_rank_00_optim_states.pt is beyond the world size")

    def _rewrite(self, path, change):
        obj = torch.load(path)
        change(obj)
        torch.save(obj, path)

    def test_corrupted_param_shapes_stage3(self):
        ck = self.write(3, 4)
        for r in range(4):
            self._rewrite(ck.path(ck.model_file(r)), lambda m: m["param_shapes"][0].__setitem__(
                "embed.weight", torch.Size([37, 11])))
        self.expect_rejected(ck.dir, "param_shapes", "fp32_flat_groups", "4 x ",
                             ck.model_file(0))

    def test_corrupted_param_shapes_stage2(self):
        ck = self.write(2, 4)
        self._rewrite(ck.path(ck.model_file()), lambda m: m["param_shapes"][1].__setitem__(
            "ln_f.weight", torch.Size([30])))
        self.expect_rejected(ck.dir, "param_shapes[1]", "single_partition_of_fp32_groups[1]")
        # A change the aligned totals do not see is caught by the per-rank lengths.
        ck = self.write(2, 4, name="again")
        self._rewrite(ck.path(ck.model_file()), lambda m: m["param_shapes"][1].__setitem__(
            "ln_f.weight", torch.Size([9])))
        self.expect_rejected(ck.dir, ck.optim_file(3), "group_paddings[1] is 0",
                             "leaves 1 padding on rank 3")

    def test_wrong_flat_group_dtype(self):
        ck = self.write(2, 2)

        def change(o):
            groups = o["optimizer_state_dict"]["single_partition_of_fp32_groups"]
            groups[0] = groups[0].detach().to(torch.bfloat16)
        self._rewrite(ck.path(ck.optim_file(1)), change)
        self.expect_rejected(ck.dir, ck.optim_file(1), "single_partition_of_fp32_groups[0]",
                             "1-D contiguous float32")

    def test_hostile_numbers(self):
        ck = self.write(3, 2)
        path = ck.path(ck.optim_file(0))
        original = torch.load(path)
        for value, phrase in [(-5, "partition_count -5"), (2**40, "partition_count"),
                              ([2, "x"], "partition_count"), ("two", "partition_count")]:
            obj = original
            obj["optimizer_state_dict"]["partition_count"] = value
            torch.save(obj, path)
            self.expect_rejected(ck.dir, phrase, ck.optim_file(0))
        obj = original
        obj["optimizer_state_dict"]["partition_count"] = 2
        obj["optimizer_state_dict"]["zero_stage"] = 7
        torch.save(obj, path)
        self.expect_rejected(ck.dir, "zero_stage is 7")
        del obj["optimizer_state_dict"]["zero_stage"]
        obj["optimizer_state_dict"].pop("fp32_flat_groups")
        torch.save(obj, path)
        self.expect_rejected(ck.dir, "not a ZeRO checkpoint")
        torch.save({"optimizer_state_dict": [1, 2]}, path)
        self.expect_rejected(ck.dir, "no optimizer_state_dict dict")
        # A huge shape in param_shapes.
        ck = self.write(3, 2, name="huge")
        self._rewrite(ck.path(ck.model_file(0)), lambda m: m["param_shapes"][0].__setitem__(
            "embed.weight", torch.Size([2**40, 2**40])))
        self.expect_rejected(ck.dir, "too large")

    WRONG_VALUES = [None, "x", -1, 2**62, [], {}, torch.zeros(2, 3), [torch.zeros(0)], {0: None}]

    def _wrong_type_cases(self, stage):
        """Yields (file, key, value, extra, tensor names inspect lists, or None for exit 3) for
        every key reshard reads, replaced in rank 0's file by each value of WRONG_VALUES."""
        ck = self.write(stage, 2, "bf16", name="s%d" % stage)
        model = zf.small_model()
        buffers = set(model.buffers)
        frozen = set(model.frozen)
        aliases = set(model.shared)
        base = {}
        for extra in ([], ["--include-optimizer"]):
            base[tuple(extra)] = sorted(t["name"] for t in self.inspect(ck.dir, *extra)["tensors"])
        optimizer_state = "base_optimizer_state" if stage == 2 else "optimizer_state_dict"
        optim_keys = ["zero_stage", "partition_count", "single_partition_of_fp32_groups",
                      "fp32_flat_groups", "group_paddings", "base_optimizer_state",
                      "optimizer_state_dict"]
        model_keys = ["module", "buffer_names", "param_shapes", "frozen_param_shapes",
                      "frozen_param_fragments", "shared_params"]

        def expected(key, value, extra):
            """The one right answer: the names inspect lists, or None (exit 3)."""
            names = base[tuple(extra)]
            if key == "group_paddings":
                return names  # not read: reshard recomputes the padding from param_shapes
            if key == optimizer_state:
                # The optimizer's moments, read only with --include-optimizer.
                return None if extra else names
            # "None of these", in the container type the key holds (None as when absent).
            says_none = value is None or (type(value) is type(saved_types[key]) and not value)
            if not says_none:
                return None
            if key == "buffer_names":
                return [n for n in names if n not in buffers]
            if key == "shared_params":
                return [n for n in names if n not in aliases]
            if key == "frozen_param_shapes":
                if stage == 2 and value is None:
                    return names  # ZeRO-2: frozen_param_fragments still hold the frozen params
                return [n for n in names if n not in frozen]
            return None

        for fname, keys, nested in [(ck.optim_file(0), optim_keys, True),
                                    (ck.model_file(0), model_keys, False)]:
            path = ck.path(fname)
            with open(path, "rb") as f:
                original = f.read()
            obj = torch.load(path)
            target = obj["optimizer_state_dict"] if nested else obj
            saved_types = {k: ([] if isinstance(v, list) else {} if isinstance(v, dict) else v)
                           for k, v in target.items()}
            for key in keys:
                if key not in target:
                    continue
                saved = target[key]
                for value in self.WRONG_VALUES:
                    target[key] = value
                    torch.save(obj, path)
                    for extra in ([], ["--include-optimizer"]):
                        yield ck, fname, key, value, extra, expected(key, value, extra)
                target[key] = saved
            with open(path, "wb") as f:
                f.write(original)

    def test_wrong_types_have_one_answer(self):
        # Every key reshard reads, replaced by values of the wrong type or size: exit 3, except
        # where the value only says "none of these" (exit 0 and exactly those tensors absent)
        # or the key is not read. Never a crash, never a silently different model.
        for stage in (2, 3):
            for ck, fname, key, value, extra, names in self._wrong_type_cases(stage):
                what = "stage %d %s %s=%r %s" % (stage, fname, key, value, extra)
                if key == "module" and isinstance(value, dict):
                    continue  # test_module_without_the_listed_buffers_is_refused
                res = self.ctl("inspect", ck.dir, "--json", *extra)
                self.assertEqual(res.returncode, 0 if names is not None else 3,
                                 what + self.describe(res))
                doc = json.loads(res.stdout.decode())
                if names is not None:
                    got = sorted(t["name"] for t in doc["tensors"])
                    self.assertEqual(got, names, what)
                else:
                    self.assertFalse(doc["ok"], what)
                    self.assertTrue(doc["error"]["message"], what)

    def test_module_without_the_listed_buffers_is_refused(self):
        # `module` replaced by a dict without the buffers buffer_names lists: exit 3 (the
        # checkpoint names buffers it does not hold), not a model silently missing them.
        for stage in (2, 3):
            ck = self.write(stage, 2, "bf16", name="m%d" % stage)
            path = ck.path(ck.model_file(0))
            obj = torch.load(path)
            for value in ({}, {0: None}):
                obj["module"] = value
                torch.save(obj, path)
                for extra in ([], ["--include-optimizer"]):
                    self.assertExit(self.ctl("inspect", ck.dir, "--json", *extra), 3)

    def test_tensor_parallel_and_mixed_prefixes(self):
        ck = self.write(2, 2)
        shutil.copy(ck.path(ck.optim_file(0)),
                    ck.path("zero_pp_rank_0_mp_rank_01_optim_states.pt"))
        self.expect_rejected(ck.dir, "mp_rank_01", "not supported")
        os.remove(ck.path("zero_pp_rank_0_mp_rank_01_optim_states.pt"))
        shutil.copy(ck.path(ck.optim_file(1)),
                    ck.path("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"))
        self.expect_rejected(ck.dir, "rank 1's optimizer file")

    def test_pipeline_folder_not_claimed(self):
        ck = self.write(1, 2)
        with open(ck.path("layer_01-model_00-model_states.pt"), "wb") as f:
            f.write(b"")
        res = self.ctl("inspect", ck.dir, "--json")
        doc = json.loads(res.stdout.decode())
        self.assertNotEqual(doc.get("format"), "deepspeed-zero", doc)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
