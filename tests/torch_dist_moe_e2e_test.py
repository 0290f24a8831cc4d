"""End-to-end tests of reshard on Megatron-Core mixture-of-experts checkpoints in the torch_dist
format (the expert axis), read and written, with checkpoints written by real torch
(tests/fixtures/torch_dist_moe_fixture.py: 8 experts over EP 2 or 4, TP 2).

Run:  /usr/bin/python3 tests/torch_dist_moe_e2e_test.py --reshardctl PATH [unittest args]

Expected tensors come from numpy alone, never from reshard: the fixture's logical model
(megatron_moe_fixture.expected: each expert once under its global id, fc1 = [gate; up]) and
hf_mixtral_e2e_test's Mixtral reference; compared element by element.
  * read: SequentialMLP's per-expert chunks and GroupedMLP's per-EP-rank chunks under
    `mlp.experts.experts.*`, the `mlp.experts.local_experts.*` spelling, per-layer expert keys
    and singleton_local_shards' per-expert keys, consolidated to safetensors; inspect names the
    experts and EP; `--format hf` gives Mixtral;
  * refused (exit 3, naming the key, the file and the expert; OUT not created): an expert no
    chunk holds, an expert two EP ranks' chunks both hold;
  * written: a Hugging Face Mixtral folder and a legacy Megatron MoE save to
    `--format megatron-torch-dist --parts 2`, its DCP tensors read back with torch
    (dcp_fixture.read_dcp) against the stacked numpy model, its common.pt args, and back to
    `--format hf` bit for bit; `--expert-parts 2`: each expert chunk in its EP rank's files,
    the args and inspect at EP 2;
  * written as Megatron-LM rank folders (`--format megatron --parts 2 --expert-parts 2`,
    sequential and grouped saves): every file against megatron_moe_fixture.rank_state(), the
    consolidation against the input's, and back to torch_dist key for key, bit for bit.
"""

import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import harness  # noqa: E402
import dcp_fixture as F  # noqa: E402
import dcp_output_test as O  # noqa: E402
import hf_mixtral_e2e_test as MX  # noqa: E402
import megatron_moe_e2e_test as ME  # noqa: E402
import megatron_moe_fixture as moe  # noqa: E402
import torch_dist_moe_fixture as tdm  # noqa: E402

FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"
FC2 = "decoder.layers.mlp.experts.experts.linear_fc2.weight"


class Base(MX.Base):
    TMP_PREFIX = "reshard-tdmoe"
    TIMEOUT = 120

    # megatron_moe_e2e_test's: consolidate to safetensors, compare, and refusals of consolidate
    # (exit 3, every needle in the message, OUT not created).
    ok = ME.Base.ok
    consolidate_st = ME.Base.consolidate_st
    assertTensorsEqual = ME.Base.assertTensorsEqual
    refused_read = ME.Base.refused


class TorchDistMoEReadTests(Base):

    def check(self, ep, grouped, seed, key_form="experts", layout="stacked"):
        model = moe.MoE(train_tp=2, seed=seed)
        tdm.write(self.p("save"), model, tp=2, ep=ep, grouped=grouped, key_form=key_form,
                  layout=layout)
        _, got = self.consolidate_st(self.p("save"))
        self.assertTensorsEqual(got, moe.expected(model), "EP%d grouped=%s" % (ep, grouped))
        return model

    def test_sequential_ep2_tp2(self):
        self.check(ep=2, grouped=False, seed=1)
        doc = self.inspect_json(self.p("save"))
        self.assertEqual(
            (doc["format"], doc["layout"], doc["description"]),
            ("megatron-torch-dist", "sharded",
             "Megatron-Core torch_dist, iter_0000010, 2 layers unstacked from 9 layer-stacked "
             "tensors, 8 experts per layer (EP 2 from the args) unstacked from 2 expert-stacked "
             "keys, TP 2, PP 1, world size 4 from the args, common.pt; PyTorch DCP, 4 ranks "
             "(__0_0 .. __3_0.distcp), 12 tensors in 127 chunks, 0 other values, flat (no "
             "planner_data)"))

    def test_grouped_ep2_tp2(self):
        self.check(ep=2, grouped=True, seed=2)

    def test_local_experts_keys_ep4_tp2(self):
        self.check(ep=4, grouped=False, seed=3, key_form="local_experts")

    def test_per_layer_keys_ep2_tp2(self):
        self.check(ep=2, grouped=False, seed=8, layout="per_layer")

    def test_singleton_keys_ep2_tp2(self):
        self.check(ep=2, grouped=False, seed=9, layout="singleton")
        res = self.ctl("inspect", self.p("save"))
        self.assertExit(res, 0)
        self.assertIn("8 experts per layer (EP 2 from the args) named by 16 per-expert keys",
                      res.text)

    def test_ep_from_the_files_without_args(self):
        # No expert_model_parallel_size in the args: EP is counted from the files that hold
        # the experts (EP rank e's experts are stored by its TP ranks).
        model = moe.MoE(train_tp=2, seed=4)
        folder, _ = tdm.write(self.p("save"), model, tp=2, ep=4, grouped=True)
        common = torch.load(os.path.join(folder, "common.pt"))
        del common["args"].expert_model_parallel_size
        del common["args"].world_size
        torch.save(common, os.path.join(folder, "common.pt"))
        res = self.ctl("inspect", self.p("save"))
        self.assertExit(res, 0)
        self.assertIn("8 experts per layer (EP 4 from the files) unstacked from 2 "
                      "expert-stacked keys, TP 2, PP 1 from the args; world size not recorded, "
                      "common.pt", res.text)

    def test_hf_mixtral_export(self):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=5)
        tdm.write(self.p("save"), model, tp=2, ep=2, grouped=False,
                  arg_overrides=MX.mixtral_args())
        out = self.p("hf")
        self.export(self.p("save"), out, "--family", "mixtral")
        self.check_tensors(out, MX.hf_reference(model))
        self.check_mixtral_config(out, model)


class TorchDistMoERefusalTests(Base):

    def test_missing_expert(self):
        model = moe.MoE(train_tp=2, seed=6)
        folder, metadata = tdm.write(self.p("save"), model, tp=2, ep=2, grouped=False)
        # Expert 5's chunks of layer 1 are gone from fc2 (as if EP rank 1 never saved them).
        md = metadata.state_dict_metadata[FC2]
        lost = [c for c in md.chunks if c.offsets[0] == 1 and c.offsets[1] == 5]
        self.assertEqual(len(lost), 2)
        md.chunks = [c for c in md.chunks if c not in lost]
        for c in lost:
            del metadata.storage_data[F.MetadataIndex(FC2, c.offsets)]
        F.write_metadata(folder, metadata)
        self.refused_read(self.p("save"), os.path.join(folder, ".metadata"),
                          '"%s"' % FC2, "expert 5 of 8 is missing: its chunks hold 48 of its "
                          "96 elements")

    def test_args_disagreeing_on_the_experts(self):
        model = moe.MoE(train_tp=2, seed=10)
        folder, _ = tdm.write(self.p("save"), model, tp=2, ep=2, grouped=False)
        common = torch.load(os.path.join(folder, "common.pt"))
        common["args"].num_experts = 16
        torch.save(common, os.path.join(folder, "common.pt"))
        self.refused_read(self.p("save"), "the checkpoint holds 8 experts per layer "
                          '("decoder.layers.0.mlp.experts.experts.linear_fc1.weight") but '
                          "args.num_experts is 16")

    def test_duplicated_expert(self):
        model = moe.MoE(train_tp=2, seed=7)
        folder, metadata = tdm.write(self.p("save"), model, tp=2, ep=2, grouped=True)
        # EP rank 1's fc1 chunks say they hold experts 2..5 (they hold 4..7): experts 2 and 3
        # are stored by both EP ranks.
        md = metadata.state_dict_metadata[FC1]
        for c in md.chunks:
            if c.offsets[1] == 4:
                info = metadata.storage_data.pop(F.MetadataIndex(FC1, c.offsets))
                c.offsets = torch.Size((c.offsets[0], 2) + tuple(c.offsets[2:]))
                metadata.storage_data[F.MetadataIndex(FC1, c.offsets)] = info
        F.write_metadata(folder, metadata)
        self.refused_read(self.p("save"), os.path.join(folder, ".metadata"), '"%s"' % FC1,
                          "expert 2 of 8 is stored twice: chunk [0:1, 0:4, 0:3, 0:8] in %s at "
                          "byte offset " % os.path.join(folder, "__0_0.distcp"),
                          "chunk [0:1, 2:6, 0:3, 0:8] in %s at byte offset "
                          % os.path.join(folder, "__2_0.distcp"))


def stacked_reference(model):
    """The torch_dist keys of the experts and router the writer must give (numpy): each stacked
    over the layers and the experts, fc1 = [gate; up]."""
    L, E = model.layers, model.experts
    return {
        "decoder.layers.mlp.router.weight": np.stack([l["router"] for l in model.layer]),
        FC1: np.stack([[np.concatenate([l["gate"][g], l["up"][g]]) for g in range(E)]
                       for l in model.layer]),
        FC2: np.stack([[l["down"][g] for g in range(E)] for l in model.layer]),
    }


class TorchDistMoEWriteTests(Base):

    def check_written(self, out, model, folder_name, tp=2):
        """The DCP tensors of the experts and router (read back with torch) against the numpy
        model, and the chunks SequentialMLP saves: one per (expert, TP block)."""
        folder = os.path.join(out, folder_name)
        metadata, got = O.read_dcp(folder)  # checks every tensor's chunks tile it exactly once
        for key, want in stacked_reference(model).items():
            self.assertTrue(torch.equal(got[key], torch.from_numpy(want)), key)
        f1 = model.moe_ffn // tp
        chunks = sorted((tuple(c.offsets), tuple(c.sizes))
                        for c in metadata.state_dict_metadata[FC1].chunks)
        self.assertEqual(chunks, sorted(
            ((0, e, b * model.moe_ffn + t * f1, 0), (model.layers, 1, f1, model.hidden))
            for e in range(model.experts) for t in range(tp) for b in range(2)))
        common = torch.load(os.path.join(folder, "common.pt"))
        args = common["args"]
        self.assertEqual((args.num_experts, args.moe_router_topk, args.tensor_model_parallel_size,
                          args.expert_model_parallel_size),
                         (model.experts, model.topk, tp, 1))
        return got

    def test_hf_mixtral_round_trip_tp2(self):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=11)
        folder, hf = MX.MixtralImportTests.hf_folder(self, model)
        core = self.p("core")
        self.assertExit(self.ctl("reshard", folder, core, "--format", "megatron-torch-dist",
                                 "--parts", 2, "--no-progress"), 0)
        self.check_written(core, model, "release")
        back = self.p("back")
        self.export(core, back)
        self.check_tensors(back, hf)
        self.check_mixtral_config(back, model)

    def test_expert_parts_ep2_tp2(self):
        # --expert-parts 2: EP rank e's experts (4 each) in the files of ranks t + TP * e, the
        # tensors outside the experts in EP rank 0's files, the args at EP 2.
        model = moe.MoE(train_tp=2, seed=13)
        tdm.write(self.p("save"), model, tp=2, ep=4, grouped=True)
        core = self.p("core")
        self.assertExit(self.ctl("reshard", self.p("save"), core, "--format",
                                 "megatron-torch-dist", "--parts", 2, "--expert-parts", 2,
                                 "--no-progress"), 0)
        folder = os.path.join(core, "iter_%07d" % tdm.ITERATION)
        metadata, got = O.read_dcp(folder)
        for key, want in stacked_reference(model).items():
            self.assertTrue(torch.equal(got[key], torch.from_numpy(want)), key)
        self.assertEqual(sorted(n for n in os.listdir(folder) if n.endswith(".distcp")),
                         ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"])
        f1 = model.moe_ffn // 2
        for index, info in metadata.storage_data.items():
            if index.fqn in (FC1, FC2):
                expert = index.offset[1]
                t = (index.offset[2] % model.moe_ffn) // f1 if index.fqn == FC1 else \
                    index.offset[3] // f1
                rank = t + 2 * (expert // 4)
            else:
                self.assertNotIn("experts.experts", index.fqn)
                rank = None
            if rank is not None:
                self.assertEqual(info.relative_path, "__%d_0.distcp" % rank, (index.fqn,
                                                                               index.offset))
            else:
                self.assertIn(info.relative_path, ("__0_0.distcp", "__1_0.distcp"), index.fqn)
        args = torch.load(os.path.join(folder, "common.pt"))["args"]
        self.assertEqual((args.num_experts, args.tensor_model_parallel_size,
                          args.expert_model_parallel_size, args.expert_tensor_parallel_size),
                         (8, 2, 2, 2))
        res = self.ok("inspect", core)
        self.assertIn("8 experts per layer (EP 2 from the args)", res.text)
        _, again = self.consolidate_st(core)
        self.assertTensorsEqual(again, moe.expected(model), "torch_dist written at EP 2")
        # Without the args' EP, the files say it: two sets of files hold the experts.
        common = torch.load(os.path.join(folder, "common.pt"))
        del common["args"].expert_model_parallel_size
        torch.save(common, os.path.join(folder, "common.pt"))
        res = self.ok("inspect", core)
        self.assertIn("8 experts per layer (EP 2 from the files)", res.text)

    def test_expert_parts_not_dividing_the_experts(self):
        model = moe.MoE(train_tp=2, seed=14)
        tdm.write(self.p("save"), model, tp=2, ep=2, grouped=False)
        out = self.p("core")
        res = self.ctl("reshard", self.p("save"), out, "--format", "megatron-torch-dist",
                       "--parts", 2, "--expert-parts", 3, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("--expert-parts 3 does not divide the 8 experts (args.num_experts)",
                      res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)

    def test_megatron_moe_to_torch_dist_tp2(self):
        # A legacy save at TP 2 x EP 2 (TEGroupedMLP names), written at TP 2 x EP 1.
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=12)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=2, grouped=True)
        core = self.p("core")
        self.assertExit(self.ctl("reshard", self.p("save"), core, "--format",
                                 "megatron-torch-dist", "--parts", 2, "--no-progress"), 0)
        self.check_written(core, model, "iter_0000100")
        _, got = self.consolidate_st(core)
        self.assertTensorsEqual(got, moe.expected(model), "torch_dist written from EP 2")


class TorchDistMoEToMegatronTests(Base):
    """torch_dist MoE -> `--format megatron --parts 2 --expert-parts 2` (Megatron-Core names in
    mp_rank_TT_EEE folders), each file against the fixture's own legacy rank_state(), then
    consolidated and written back to torch_dist."""

    def check(self, grouped, seed):
        model = moe.MoE(train_tp=2, seed=seed)
        folder, _ = tdm.write(self.p("save"), model, tp=2, ep=4, grouped=grouped,
                              arg_overrides={"ckpt_format": "torch_dist"})
        mg = self.p("mg")
        self.ok("reshard", self.p("save"), mg, "--format", "megatron", "--parts", 2,
                "--expert-parts", 2)
        iteration = os.path.join(mg, "iter_%07d" % tdm.ITERATION)
        self.assertEqual(sorted(os.listdir(iteration)),
                         ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"])
        for t in range(2):
            for e in range(2):
                name = moe.rank_folder(t, 0, e, 1, 2)
                ckpt = torch.load(os.path.join(iteration, name, "model_optim_rng.pt"))
                # EP rank e holds experts 4e .. 4e + 3 as local experts 0 .. 3, named as the
                # args' moe_grouped_gemm says (TEGroupedMLP or SequentialMLP).
                want = moe.rank_state(model, t, 2, 0, 1, e, 2, grouped)
                self.assertTensorsEqual(ckpt["model"], want, name)
                args = ckpt["args"]
                self.assertEqual((args.tensor_model_parallel_size, args.expert_model_parallel_size,
                                  args.expert_tensor_parallel_size, args.num_experts,
                                  args.ckpt_format),
                                 (2, 2, 2, 8, "torch"), name)
                self.assertEqual(ckpt["iteration"], tdm.ITERATION, name)
        # Consolidated: the torch_dist input's consolidation and the numpy reference.
        _, original = self.consolidate_st(self.p("save"))
        _, again = self.consolidate_st(mg)
        self.assertTensorsEqual(again, original, "torch_dist -> megatron EP 2 -> consolidated")
        self.assertTensorsEqual(again, moe.expected(model), "megatron EP 2 consolidated")
        # And back to torch_dist: every key of the original save, bit for bit.
        core = self.p("core")
        self.ok("reshard", mg, core, "--format", "megatron-torch-dist", "--parts", 2)
        want = F.read_dcp(folder)  # the fixture's own save, read with plain pickle
        _, got = O.read_dcp(os.path.join(core, "iter_%07d" % tdm.ITERATION))
        self.assertEqual(sorted(got), sorted(want), "torch_dist keys")
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                self.assertTrue(torch.equal(got[key], value), key)

    def test_sequential_to_megatron_tp2_ep2(self):
        self.check(grouped=False, seed=31)

    def test_grouped_to_megatron_tp2_ep2(self):
        self.check(grouped=True, seed=32)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
