"""End-to-end tests of reshard's DeepSpeed reader on mixture-of-experts saves without ZeRO and
with ZeRO-1/2 (mp_rank_XX_model_states.pt + layer_{m}_expert_{g}_mp_rank_XX_model_states.pt +
expp_rank_{ep}_mp_rank_XX_optim_states.pt), written with real torch by
tests/fixtures/deepspeed_moe_fixture.py.

Run:  /usr/bin/python3 tests/deepspeed_moe_e2e_test.py --reshardctl PATH [unittest args]

Expected tensors are the fixture model's full state dict (every expert under its global id, as
a model with EP 1 names it), never reshard's, compared element by element:
  * 8 experts over EP 2 and EP 4, TP 1 and TP 2 (experts replicated over TP, and split with
    expert tensor parallelism), 4 layers of which 1 and 3 are MoE, consolidated to safetensors;
  * inspect: the format, the description (MoE layers, experts, EP, TP), tensors in the model's
    state dict order (each layer's experts after its router);
  * verify of a TP 2 save: TP rank 1's copies of replicated tensors (a layer norm, an expert)
    compared byte by byte with TP rank 0's, a flipped byte named with both files and offsets;
  * refusals (exit 3, the message names the expert and the file, OUT not created): an expert
    file missing, an expert's file copied under another expert's name, two names of one expert,
    an expert file of another save, model states of a ZeRO run without optimizer files,
    --include-optimizer;
  * DeepSpeed's legacy expert_{g}_mp_rank_XX files (every layer's expert g in one file);
  * ZeRO-1/2 (deepspeed_moe_fixture.write_zero: 4 data-parallel ranks, EP 2 and 4, TP 1 and
    2, both rank placements): the fp32 master weights and Adam moments of the optimizer files, compared
    with the fixture's fp32 tensors (the model states and expert files hold bf16/fp16 copies);
    a missing rank file, an expert in no mapping, fragments leaving a gap, partition counts of
    another save or disagreeing with EP, ZeRO-3 files refused naming the file.
"""

import collections
import json
import os
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import deepspeed_moe_fixture as dsm  # noqa: E402
import megatron_moe_e2e_test  # noqa: E402
from st_torch import read_file as st_tensors  # noqa: E402


class Base(megatron_moe_e2e_test.Base):
    """The Megatron MoE suite's checks: refused() (exit 3, every needle, OUT not created) and
    assertTensorsEqual()."""
    TMP_PREFIX = "reshard-dsmoe"

    def save(self, tp, ep, seed, expert_tp=False, name="save", legacy=False):
        model = dsm.Model(seed=seed)
        folder = dsm.write(self.p(name), model, tp=tp, ep=ep, expert_tp=expert_tp,
                           legacy=legacy)
        return model, folder

    def rules_args(self, tp, expert_tp=False):
        if tp == 1:
            return []
        path = self.p("rules-%s.json" % expert_tp)
        with open(path, "w") as f:
            json.dump(dsm.rules(expert_tp), f)
        return ["--rules", path]

    def merged_st(self, src, *extra):
        out = self.p("out-st-%d" % len(os.listdir(self.tmp)))
        self.ok("consolidate", src, out, *extra)
        return st_tensors(os.path.join(out, "model.safetensors"))

    def replace_expert_file(self, tp, ep, seed, source, name, source_folder=None):
        """A save whose expert file `name` is a copy of `source` (of `source_folder`, default
        the save itself)."""
        _, folder = self.save(tp, ep, seed)
        shutil.copy(os.path.join(source_folder or folder, source), os.path.join(folder, name))
        return folder


class DeepSpeedMoEReadTests(Base):

    def check(self, tp, ep, seed, expert_tp=False):
        model, folder = self.save(tp, ep, seed, expert_tp)
        got = self.merged_st(os.path.dirname(folder), *self.rules_args(tp, expert_tp))
        self.assertTensorsEqual(got, model.full, "TP%d x EP%d" % (tp, ep))
        return model, folder

    def test_ep2_tp1(self):
        self.check(tp=1, ep=2, seed=1)

    def test_ep4_tp1(self):
        self.check(tp=1, ep=4, seed=2)

    def test_ep2_tp2_experts_replicated(self):
        self.check(tp=2, ep=2, seed=3)

    def test_ep4_tp2_experts_split(self):
        self.check(tp=2, ep=4, seed=4, expert_tp=True)

    def test_global_ids(self):
        # EP 4, 2 local experts each: EP rank 3's local expert 1 is expert 7, in its own file.
        model, folder = self.save(tp=1, ep=4, seed=5)
        got = self.merged_st(folder)
        name = "language_model.encoder.layers.3.mlp" + dsm.INFIX + "7.dense_4h_to_h.weight"
        saved = torch.load(os.path.join(folder, "layer_1_expert_7_mp_rank_00_model_states.pt"))
        self.assertEqual(list(saved)[2], name)
        self.assertTrue(torch.equal(got[name], saved[name]))
        self.assertTrue(torch.equal(got[name], model.full[name]))

    def test_inspect(self):
        model, folder = self.save(tp=2, ep=4, seed=6)
        doc = self.inspect_json(folder)
        doc = doc.get("result", doc)
        self.assertEqual(doc["format"], "deepspeed-zero")
        self.assertEqual(doc["layout"], "model-parallel-parts")
        self.assertEqual(
            doc["description"],
            "DeepSpeed MoE (no ZeRO), 2 MoE layers x 8 experts, EP 4, TP 2, weights from "
            "mp_rank_{00..01}_model_states.pt module and "
            "layer_{0..1}_expert_{0..7}_mp_rank_{00..01}_model_states.pt, tag global_step10, "
            "%d tensors each" % len(model.full))
        model, folder = self.save(tp=1, ep=2, seed=7, name="save-tp1")
        doc = self.inspect_json(os.path.dirname(folder))
        doc = doc.get("result", doc)
        self.assertEqual(doc["layout"], "sharded")
        self.assertIn("2 MoE layers x 8 experts, EP 2, TP 1", doc["description"])
        # The model's own state dict order: each layer's experts right after its router.
        self.assertEqual([t["name"] for t in doc["tensors"]], list(model.full))


class DeepSpeedMoELegacyTests(Base):
    """DeepSpeed's layout before per-layer expert files: expert_{g}_mp_rank_XX_model_states.pt
    holding expert g of every MoE layer, `num_experts` one int."""

    def test_ep2_tp1(self):
        model, folder = self.save(tp=1, ep=2, seed=41, legacy=True)
        self.assertFalse([n for n in os.listdir(folder) if n.startswith("layer_")])
        got = self.merged_st(folder)
        self.assertTensorsEqual(got, model.full, "legacy EP2")

    def test_ep4_tp2_inspect(self):
        model, folder = self.save(tp=2, ep=4, seed=42, legacy=True)
        got = self.merged_st(folder, *self.rules_args(2))
        self.assertTensorsEqual(got, model.full, "legacy EP4 TP2")
        doc = self.inspect_json(folder)
        doc = doc.get("result", doc)
        self.assertEqual(
            doc["description"],
            "DeepSpeed MoE (no ZeRO), 2 MoE layers x 8 experts, EP 4, TP 2, weights from "
            "mp_rank_{00..01}_model_states.pt module and "
            "expert_{0..7}_mp_rank_{00..01}_model_states.pt (DeepSpeed's legacy layout: every "
            "layer's expert g in one file), tag global_step10, %d tensors each" % len(model.full))
        self.assertEqual([t["name"] for t in doc["tensors"]], list(model.full))

    def test_missing_expert(self):
        _, folder = self.save(tp=1, ep=2, seed=43, legacy=True)
        os.remove(os.path.join(folder, "expert_6_mp_rank_00_model_states.pt"))
        self.refused(folder, "expert 6 is missing: expert_6_mp_rank_00_model_states.pt is not "
                     "in the folder")

    def test_expert_file_under_another_experts_name(self):
        _, folder = self.save(tp=1, ep=2, seed=44, legacy=True)
        shutil.copy(os.path.join(folder, "expert_1_mp_rank_00_model_states.pt"),
                    os.path.join(folder, "expert_2_mp_rank_00_model_states.pt"))
        self.refused(folder, "expert_2_mp_rank_00_model_states.pt",
                     "is a parameter of expert 1, but the file is expert 2's")

    def test_mixed_with_per_layer_files(self):
        _, folder = self.save(tp=1, ep=2, seed=45, legacy=True)
        _, other = self.save(tp=1, ep=2, seed=46, name="other")
        name = "layer_0_expert_0_mp_rank_00_model_states.pt"
        shutil.copy(os.path.join(other, name), os.path.join(folder, name))
        self.refused(folder, name, "are of two saves")


class DeepSpeedMoEZeroTests(Base):
    """MoE saves with ZeRO-1/2: fp32 master weights (and Adam moments) out of the ranks'
    optimizer files, compared with the fixture's known fp32 tensors; the 16-bit copies in the
    model states and expert files are bf16 and differ from them."""

    def zero_save(self, ep, world, seed, name="save", **kwargs):
        model = dsm.Model(seed=seed)
        folder = dsm.write_zero(self.p(name), model, ep=ep, world=world, **kwargs)
        return model, folder

    def check(self, ep, world, seed, **kwargs):
        model, folder = self.zero_save(ep, world, seed, **kwargs)
        got = self.merged_st(os.path.dirname(folder), *self.rules_args(kwargs.get("tp", 1)))
        self.assertTensorsEqual(got, model.full, "ZeRO EP%d DP%d" % (ep, world))
        return model, folder

    def test_zero2_ep2_dp4(self):
        self.check(ep=2, world=4, seed=21)

    def test_zero1_ep4_dp4(self):
        self.check(ep=4, world=4, seed=22, stage=1, half=torch.float16)

    def test_zero2_ep2_dp4_tp2(self):
        # Each TP rank's ZeRO files hold its shards; --rules merges the two parts.
        model, folder = self.check(ep=2, world=4, seed=34, tp=2)
        doc = self.inspect_json(folder)
        doc = doc.get("result", doc)
        self.assertEqual(doc["layout"], "model-parallel-parts")
        self.assertEqual(
            doc["description"],
            "DeepSpeed MoE with ZeRO-2, 2 MoE layers x 8 experts, EP 2, TP 2, PP 1, world size 8 "
            "(4 data-parallel ranks x TP 2): fp32 master weights from "
            "bf16_zero_pp_rank_{0..3}_mp_rank_{00..01}_optim_states.pt (expert groups over 2 "
            "ranks each; rank r is expert-parallel rank r %% 2, DeepSpeed's default "
            "expert-then-data placement), names and shapes from "
            "mp_rank_{00..01}_model_states.pt and "
            "layer_{0..1}_expert_{0..7}_mp_rank_{00..01}_model_states.pt, tag global_step10, "
            "%d tensors each" % len(model.full))

    def test_include_optimizer_tp2(self):
        model = dsm.Model(seed=35)
        moments = dsm.ZeroMoments(model, 35)
        folder = dsm.write_zero(self.p("save"), model, ep=4, world=4, moments=moments, tp=2)
        rules = dsm.rules()
        # The moments follow their param's rule.
        rules["rules"] = [dict(r, pattern=r["pattern"].replace("$", r"(\.exp_avg(_sq)?)?$"))
                          for r in rules["rules"]]
        path = self.p("rules-moments.json")
        with open(path, "w") as f:
            json.dump(rules, f)
        got = self.merged_st(folder, "--include-optimizer", "--rules", path)
        want = collections.OrderedDict(model.full)
        for name in model.full:
            want[name + ".exp_avg"] = moments.exp_avg[name]
            want[name + ".exp_avg_sq"] = moments.exp_avg_sq[name]
        self.assertTensorsEqual(got, want, "ZeRO TP2 EP4 DP4 with moments")

    def test_data_before_expert_placement(self):
        # use_data_before_expert_parallelism: rank r is expert-parallel rank r // (W / EP).
        self.check(ep=2, world=4, seed=23, data_before_expert=True)

    def test_include_optimizer(self):
        model = dsm.Model(seed=24)
        moments = dsm.ZeroMoments(model, 24)
        folder = dsm.write_zero(self.p("save"), model, ep=2, world=4, moments=moments)
        got = self.merged_st(folder, "--include-optimizer")
        want = collections.OrderedDict(model.full)
        for name in model.full:
            want[name + ".exp_avg"] = moments.exp_avg[name]
            want[name + ".exp_avg_sq"] = moments.exp_avg_sq[name]
        self.assertTensorsEqual(got, want, "ZeRO EP2 DP4 with moments")

    def test_inspect(self):
        model, folder = self.zero_save(ep=2, world=4, seed=25)
        doc = self.inspect_json(folder)
        doc = doc.get("result", doc)
        self.assertEqual(doc["format"], "deepspeed-zero")
        self.assertEqual(
            doc["description"],
            "DeepSpeed MoE with ZeRO-2, 2 MoE layers x 8 experts, EP 2, TP 1, PP 1, world size 4 "
            "(4 data-parallel ranks x TP 1): fp32 master "
            "weights from bf16_zero_pp_rank_{0..3}_mp_rank_00_optim_states.pt (expert groups "
            "over 2 ranks each; rank r is expert-parallel rank r %% 2, DeepSpeed's default "
            "expert-then-data placement), names and shapes from mp_rank_00_model_states.pt and "
            "layer_{0..1}_expert_{0..7}_mp_rank_00_model_states.pt, tag global_step10, "
            "%d tensors" % len(model.full))
        self.assertEqual([t["name"] for t in doc["tensors"]], list(model.full))
        self.assertEqual({t["dtype"] for t in doc["tensors"]}, {"F32"})

    def test_missing_rank_file(self):
        _, folder = self.zero_save(ep=2, world=4, seed=26)
        os.remove(os.path.join(folder, "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"))
        self.refused(folder, "rank 3's optimizer file "
                     "(bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt) is missing")

    def test_expert_missing_from_every_mapping(self):
        # Every file consistent, but one expert parameter is in no rank's optimizer.
        name = "language_model.encoder.layers.3.mlp" + dsm.INFIX + "5.dense_4h_to_h.bias"
        _, folder = self.zero_save(ep=2, world=4, seed=27, drop=(name,))
        self.refused(folder, "\"%s\" (expert 5 of language_model.encoder.layers.3.mlp) is in "
                     "no param_slice_mappings of "
                     "bf16_zero_pp_rank_{0..3}_mp_rank_00_optim_states.pt" % name)

    def test_fragments_that_do_not_tile_a_partition(self):
        # One expert parameter's fragment taken out of the mappings of the ranks holding it:
        # a gap in those ranks' partitions.
        name = "language_model.encoder.layers.1.mlp" + dsm.INFIX + "6.dense_h_to_4h.bias"
        _, folder = self.zero_save(ep=2, world=4, seed=28)
        for rank in (1, 3):
            path = os.path.join(folder, "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % rank)
            top = torch.load(path)
            mapping = top["optimizer_state_dict"]["param_slice_mappings"][1]
            mapping.pop(name.replace(dsm.INFIX + "6.", dsm.INFIX + "2."), None)
            torch.save(top, path)
        after = "language_model.encoder.layers.1.mlp" + dsm.INFIX + "2.dense_4h_to_h.weight"
        self.refused(folder, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: "
                     "param_slice_mappings[1][\"%s\"] starts at 704, but the fragments before "
                     "it end at 688: the fragments do not tile "
                     "single_partition_of_fp32_groups[1]" % after)

    def test_zero3_refused(self):
        # DeepSpeed asserts "MoE not supported with Stage 3": ZeRO-3 files are of another save.
        _, folder = self.zero_save(ep=2, world=4, seed=32)
        name = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
        top = torch.load(os.path.join(folder, name))
        top["optimizer_state_dict"]["zero_stage"] = 3
        torch.save(top, os.path.join(folder, name))
        self.refused(folder, name + ": a ZeRO-3 optimizer file beside the expert files of a "
                     "DeepSpeed mixture-of-experts save: DeepSpeed does not run MoE with ZeRO-3")
        _, folder = self.save(tp=1, ep=2, seed=33, name="zero3-states")
        name = "zero_pp_rank_0_mp_rank_00_model_states.pt"
        shutil.copy(os.path.join(folder, "mp_rank_00_model_states.pt"),
                    os.path.join(folder, name))
        self.refused(folder, name + " (ZeRO-3 model states) beside the expert files of a "
                     "DeepSpeed mixture-of-experts save", "DeepSpeed does not run MoE with ZeRO-3")

    def test_two_saves_mixed(self):
        _, other = self.zero_save(ep=4, world=4, seed=29, name="other")
        _, folder = self.zero_save(ep=2, world=4, seed=30)
        name = "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
        shutil.copy(os.path.join(other, name), os.path.join(folder, name))
        self.refused(folder, name + ": ZeRO-2 with partition_count [4, 1], but "
                     "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt has ZeRO-2 with [4, 2] "
                     "(files of two saves mixed)")

    def test_expert_group_partition_count_disagrees_with_ep(self):
        _, folder = self.zero_save(ep=2, world=4, seed=31)
        for rank in range(4):
            path = os.path.join(folder, "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % rank)
            top = torch.load(path)
            top["optimizer_state_dict"]["partition_count"] = [4, 4]
            torch.save(top, path)
        self.refused(folder, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "param group 1 holds experts and is partitioned over 4 ranks, but 4 ranks "
                     "at EP 2 (expp_rank_0..1) give expert groups of 2")


class DeepSpeedMoEVerifyTests(Base):

    def alter(self, path, key, element, byte):
        """Flips byte `byte` of element `element` of tensor `key` in the torch.save file `path`
        (saved again: its CRC-32s are right); returns the tensor's original bytes."""
        sd = torch.load(path)
        tensor = (sd["module"] if "module" in sd else sd)[key]
        original = tensor.contiguous().view(torch.uint8).flatten().numpy().tobytes()
        tensor.view(torch.uint8).view(-1)[element * tensor.element_size() + byte] ^= 0x40
        torch.save(sd, path)
        return original

    def offset(self, path, data, byte):
        """The file offset of byte `byte` of the tensor bytes `data`, stored once in `path`."""
        with open(path, "rb") as f:
            content = f.read()
        self.assertEqual(content.count(data), 1, path)
        return content.find(data) + byte

    def test_tp2_replicated_copies_compared_byte_by_byte(self):
        # TP 2 without expert tensor parallelism: the layer norms are replicated in both TP
        # ranks' model states, every expert in both TP ranks' expert files. Conversions read TP
        # rank 0's copies; verify compares TP rank 1's with them.
        _, folder = self.save(tp=2, ep=2, seed=21)
        rules = self.rules_args(2)
        out = self.p("out")
        self.ok("consolidate", folder, out, "--no-progress", *rules)
        self.ok("verify", folder, out, *rules)
        norm = "language_model.encoder.layers.0.input_layernorm.weight"
        expert = ("language_model.encoder.layers.1.mlp" + dsm.INFIX +
                  "5.dense_4h_to_h.weight")
        checks = []
        for key, name, element, byte in (
                (norm, "mp_rank_%02d_model_states.pt", 3, 2),
                (expert, "layer_0_expert_5_mp_rank_%02d_model_states.pt", 17, 1)):
            read, copy = (os.path.join(folder, name % rank) for rank in (0, 1))
            data = self.alter(copy, key, element, byte)
            first = element * 4 + byte
            copy_offset = self.offset(
                copy, data[:first] + bytes([data[first] ^ 0x40]) + data[first + 1:], first)
            read_offset = self.offset(read, data, first)
            checks.append((
                "%s (replicated copy in %s)" % (key, copy), 1, element,
                "values differ from the copy read, in %s; first differing byte: byte %d of the "
                "copies (offset %d of %s, offset %d of %s)" % (
                    read, first, copy_offset, copy, read_offset, read),
                first, read, read_offset, copy, copy_offset))
        for a, b in ((folder, out), (out, folder)):
            res = self.ctl("verify", a, b, "--json", *rules)
            self.assertExit(res, 4)
            doc = json.loads(res.stdout_text)
            self.assertEqual([(m["name"], m["mismatches"], m["first_index"], m["reason"],
                               m["first_byte"], m["a_file"], m["a_offset"], m["b_file"],
                               m["b_offset"]) for m in doc["mismatched"]], checks)
            self.assertEqual(doc["only_in_a"] + doc["only_in_b"], [])


class DeepSpeedMoERefusalTests(Base):

    def test_missing_expert(self):
        _, folder = self.save(tp=1, ep=2, seed=11)
        os.remove(os.path.join(folder, "layer_1_expert_5_mp_rank_00_model_states.pt"))
        self.refused(folder, "expert 5 of MoE layer 1 is missing",
                     "layer_1_expert_5_mp_rank_00_model_states.pt is not in the folder")

    def test_expert_file_under_another_experts_name(self):
        folder = self.replace_expert_file(1, 2, 12, "layer_0_expert_2_mp_rank_00_model_states.pt",
                                          "layer_0_expert_3_mp_rank_00_model_states.pt")
        self.refused(folder, "layer_0_expert_3_mp_rank_00_model_states.pt",
                     "is a parameter of expert 2, but the file is expert 3 of MoE layer 0's")

    def test_two_names_of_one_expert(self):
        folder = self.replace_expert_file(1, 4, 13, "layer_1_expert_3_mp_rank_00_model_states.pt",
                                          "layer_1_expert_03_mp_rank_00_model_states.pt")
        self.refused(folder, "layer_1_expert_03_mp_rank_00_model_states.pt",
                     "layer_1_expert_3_mp_rank_00_model_states.pt", "are both expert 3 of "
                     "MoE layer 1")

    def test_expert_of_another_save(self):
        other_folder = dsm.write(self.p("other"), dsm.Model(seed=15, ffn=24), tp=1, ep=2)
        name = "layer_0_expert_6_mp_rank_00_model_states.pt"
        folder = self.replace_expert_file(1, 2, 14, name, name, other_folder)
        self.refused(folder, name, "(expert 6 of MoE layer 0) is F32 [24, 8], but expert 0 has "
                     "F32 [16, 8] (experts of two saves mixed?)")

    def test_moe_model_states_of_a_zero_run_without_optimizer_files(self):
        _, folder = self.save(tp=1, ep=2, seed=18, name="zero1")
        path = os.path.join(folder, "mp_rank_00_model_states.pt")
        states = torch.load(path)
        states["ds_config"]["zero_optimization"]["stage"] = 1
        torch.save(states, path)
        self.refused(folder, "DeepSpeed ZeRO-1 checkpoint global_step10 has no optimizer files",
                     "zero_pp_rank_*_mp_rank_00_optim_states.pt")

    def test_include_optimizer(self):
        _, folder = self.save(tp=1, ep=2, seed=16)
        out = self.p("refused-out")
        res = self.ctl("consolidate", folder, out, "--no-progress", "--include-optimizer")
        self.assertExit(res, 3)
        self.assertIn("--include-optimizer: DeepSpeed without ZeRO keeps the optimizer state in "
                      "`optimizer` (with mixture-of-experts, each expert-parallel rank's in "
                      "expp_rank_{ep}_mp_rank_XX_optim_states.pt)", res.text, self.describe(res))
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
