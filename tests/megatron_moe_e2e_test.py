"""End-to-end tests of reshard's Megatron reader on mixture-of-experts checkpoints with expert
parallelism (Megatron-Core GPT saved in the legacy mp_rank_TT[_PPP][_EEE] folders), written with
real torch by tests/fixtures/megatron_moe_fixture.py.

Run:  /usr/bin/python3 tests/megatron_moe_e2e_test.py --reshardctl PATH [unittest args]

Expected tensors come from the fixture's numpy model (each expert under its global id
ep_rank * E_local + l, fc1 = [gate; up]), never from reshard, compared element by element:
  * 8 experts over EP 2 and EP 4, TP 2, SequentialMLP and TEGroupedMLP names, PP 1 (folders
    mp_rank_TT_EEE) and PP 2 (mp_rank_TT_PPP_EEE), consolidated to safetensors;
  * inspect's description; verify of the input against its consolidation (with TP 1 the EP
    copies of the tensors outside the experts are compared too: a differing copy is a
    difference);
  * refusals (exit 3, the message names the expert and the folders, OUT not created): an EP
    rank folder missing, an expert in two EP ranks, a missing expert, EP ranks of two saves;
  * `reshard --format megatron --parts 2 --expert-parts EP` (EP 2 -> 4 and 4 -> 1, both forms):
    every output file's tensors against the fixture's own rank_state() of the new topology
    (expert g on EP rank g // E_local as local expert g % E_local), its args, and the round
    trip EP 2 -> 4 -> consolidated equal to the original's consolidation; refusals of an EP
    that does not divide the experts and of --expert-parts on a dense model;
  * verify of a TP 2 save whose EP copies of a tensor outside the experts differ.
"""

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
import megatron_fixture as mf  # noqa: E402
import megatron_moe_fixture as moe  # noqa: E402
from st_torch import read_file as st_tensors  # noqa: E402

LAYER0 = "decoder.layers.0.mlp.experts"


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-moe"
    TIMEOUT = 120

    def ok(self, *args):
        progress = [] if args[0] in ("inspect", "plan", "verify") else ["--no-progress"]
        res = self.ctl(*(list(args) + progress))
        self.assertExit(res, 0)
        return res

    def refused(self, src, *needles):
        """consolidate exits 3, its message holds every needle, and OUT is not created."""
        out = self.p("refused-out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        for needle in needles:
            self.assertIn(needle, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)
        return res

    def consolidate_st(self, src):
        out = self.p("out-st-%d" % len(os.listdir(self.tmp)))
        self.ok("consolidate", src, out)
        return out, st_tensors(os.path.join(out, "model.safetensors"))

    def assertTensorsEqual(self, got, want, what=""):
        self.assertEqual(sorted(got), sorted(want), "%s: names differ" % what)
        for name, w in want.items():
            g = got[name]
            self.assertEqual(g.dtype, w.dtype, "%s %s dtype" % (what, name))
            self.assertEqual(tuple(g.shape), tuple(w.shape), "%s %s shape" % (what, name))
            self.assertTrue(torch.equal(g, w.contiguous()), "%s %s: values differ" % (what, name))


class MoEReadTests(Base):

    def check(self, tp, pp, ep, grouped, seed):
        model = moe.MoE(train_tp=tp, seed=seed)
        folder = moe.write(self.p("save"), model, tp=tp, pp=pp, ep=ep, grouped=grouped)
        out, got = self.consolidate_st(self.p("save"))
        what = "TP%d x PP%d x EP%d %s" % (tp, pp, ep, "grouped" if grouped else "sequential")
        self.assertTensorsEqual(got, moe.expected(model), what)
        return model, folder, out

    def test_ep2_tp2_pp1_sequential(self):
        # PP = 1: mp_rank_00_001 is EP rank 1 (the args say so), not PP rank 1.
        _, folder, _ = self.check(tp=2, pp=1, ep=2, grouped=False, seed=1)
        self.assertEqual(sorted(os.listdir(folder)),
                         ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"])

    def test_ep4_tp2_pp1_grouped(self):
        self.check(tp=2, pp=1, ep=4, grouped=True, seed=2)

    def test_ep2_tp2_pp2_grouped(self):
        _, folder, _ = self.check(tp=2, pp=2, ep=2, grouped=True, seed=3)
        self.assertIn("mp_rank_01_001_001", os.listdir(folder))

    def test_ep4_tp2_pp2_sequential(self):
        self.check(tp=2, pp=2, ep=4, grouped=False, seed=4)

    def test_global_ids(self):
        # EP 4, 2 local experts each: EP rank 3's local expert 1 is expert 7.
        model = moe.MoE(train_tp=1, seed=5)
        folder = moe.write(self.p("save"), model, tp=1, pp=1, ep=4, grouped=True)
        _, got = self.consolidate_st(folder)
        rank3 = torch.load(os.path.join(folder, "mp_rank_00_003", "model_optim_rng.pt"))["model"]
        self.assertTrue(torch.equal(got[LAYER0 + ".local_experts.7.linear_fc2.weight"],
                                    rank3[LAYER0 + ".linear_fc2.weight1"]))

    def test_inspect(self):
        model = moe.MoE(train_tp=2, seed=6)
        folder = moe.write(self.p("save"), model, tp=2, pp=2, ep=4)
        res = self.ok("inspect", folder, "--json")
        doc = json.loads(res.stdout_text)
        doc = doc.get("result", doc)
        self.assertEqual(doc["format"], "megatron")
        self.assertEqual(doc["parts"], 2)
        self.assertEqual(doc["description"].split(";")[0],
                         "Megatron-LM TP2 x PP2 x EP4, 8 experts, 2 layers, SwiGLU, iteration 100")

    def test_verify_compares_ep_copies(self):
        # TP 1: the EP copies are compared within the one part.
        model = moe.MoE(train_tp=1, seed=7)
        folder = moe.write(self.p("save"), model, tp=1, pp=1, ep=2)
        out, _ = self.consolidate_st(folder)
        self.ok("verify", folder, out)
        # EP rank 1's copy of the router (a tensor outside the experts) differs from rank 0's.
        path = os.path.join(folder, "mp_rank_00_001", "model_optim_rng.pt")
        ckpt = torch.load(path)
        ckpt["model"]["decoder.layers.1.mlp.router.weight"][2, 3] += 1.0
        torch.save(ckpt, path)
        res = self.ctl("verify", folder, out)
        self.assertExit(res, 4)
        self.assertIn("decoder.layers.1.mlp.router.weight", res.text, self.describe(res))


class MoEReshardTests(Base):
    """reshard --format megatron --parts 2 --expert-parts EP, against the fixture's layout."""

    def reshard(self, src, ep, *extra):
        out = self.p("out-ep%d-%d" % (ep, len(os.listdir(self.tmp))))
        self.ok("reshard", src, out, "--format", "megatron", "--parts", 2, "--expert-parts", ep,
                *extra)
        return out

    def check_files(self, model, out, ep, grouped):
        """Every rank file of OUT (TP 2, PP 1, EP `ep`) holds what Megatron saves there."""
        folder = os.path.join(out, "iter_0000100")
        want_folders = sorted(moe.rank_folder(t, 0, e, 1, ep) for t in range(2) for e in range(ep))
        self.assertEqual(sorted(os.listdir(folder)), want_folders)
        with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
            self.assertEqual(f.read(), "100")
        for t in range(2):
            for e in range(ep):
                name = moe.rank_folder(t, 0, e, 1, ep)
                ckpt = torch.load(os.path.join(folder, name, "model_optim_rng.pt"))
                want = moe.rank_state(model, t, 2, 0, 1, e, ep, grouped)
                self.assertEqual(list(ckpt["model"]), list(want), name)
                self.assertTensorsEqual(ckpt["model"], want, name)
                args = ckpt["args"]
                self.assertEqual(args.expert_model_parallel_size, ep, name)
                self.assertEqual(args.num_experts, 8, name)
                self.assertEqual(args.tensor_model_parallel_size, 2, name)
                self.assertEqual(args.moe_grouped_gemm, grouped, name)
                self.assertEqual(ckpt["iteration"], 100, name)

    def test_ep2_to_ep4_sequential(self):
        model = moe.MoE(train_tp=2, seed=21)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=2, grouped=False)
        out = self.reshard(self.p("save"), 4)
        self.check_files(model, out, 4, grouped=False)
        # Round trip: the EP 4 output consolidates to what the EP 2 save consolidates to.
        _, original = self.consolidate_st(self.p("save"))
        _, again = self.consolidate_st(out)
        self.assertTensorsEqual(again, original, "EP 2 -> EP 4 -> consolidated")
        self.assertTensorsEqual(again, moe.expected(model), "EP 4 consolidated")

    def test_ep2_to_ep4_grouped(self):
        model = moe.MoE(train_tp=2, seed=22)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=2, grouped=True)
        out = self.reshard(self.p("save"), 4)
        self.check_files(model, out, 4, grouped=True)
        _, original = self.consolidate_st(self.p("save"))
        _, again = self.consolidate_st(out)
        self.assertTensorsEqual(again, original, "EP 2 -> EP 4 -> consolidated")

    def test_ep4_to_ep1_grouped(self):
        model = moe.MoE(train_tp=2, seed=23)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=4, grouped=True)
        out = self.reshard(self.p("save"), 1)
        self.check_files(model, out, 1, grouped=True)

    def test_ep4_to_ep1_sequential(self):
        model = moe.MoE(train_tp=2, seed=24)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=4, grouped=False)
        out = self.reshard(self.p("save"), 1)
        self.check_files(model, out, 1, grouped=False)
        self.ok("verify", self.p("save"), out)

    def test_expert_parts_not_dividing_experts(self):
        model = moe.MoE(train_tp=2, seed=25)
        moe.write(self.p("save"), model, tp=2, pp=1, ep=2)
        out = self.p("out")
        res = self.ctl("reshard", self.p("save"), out, "--format", "megatron", "--parts", 2,
                       "--expert-parts", 3, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("--expert-parts 3 does not divide the 8 experts (args.num_experts)",
                      res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)

    def test_expert_parts_on_dense_model(self):
        model = mf.GPT(train_tp=2, seed=26)
        mf.write_megatron_lm(self.p("save"), model, tp=2, pp=1)
        out = self.p("out")
        res = self.ctl("reshard", self.p("save"), out, "--format", "megatron", "--parts", 2,
                       "--expert-parts", 2, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("--expert-parts 2: the model has no mixture-of-experts layers", res.text,
                      self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)

    def test_verify_compares_ep_copies_with_tp2(self):
        # TP 2: TP rank 1's EP rank 1 copies, of a replicated tensor (the router) and of a split
        # one (linear_proj), are compared too.
        model = moe.MoE(train_tp=2, seed=27)
        folder = moe.write(self.p("save"), model, tp=2, pp=1, ep=2)
        out, _ = self.consolidate_st(self.p("save"))
        self.ok("verify", self.p("save"), out)
        path = os.path.join(folder, "mp_rank_01_001", "model_optim_rng.pt")
        ckpt = torch.load(path)
        ckpt["model"]["decoder.layers.1.mlp.router.weight"][2, 3] += 1.0
        ckpt["model"]["decoder.layers.0.self_attention.linear_proj.weight"][1, 1] += 1.0
        torch.save(ckpt, path)
        res = self.ctl("verify", self.p("save"), out)
        self.assertExit(res, 4)
        for needle in ("decoder.layers.1.mlp.router.weight (replicated copy in %s)" % path,
                       "decoder.layers.0.self_attention.linear_proj.weight (replicated copy in %s)"
                       % path,
                       os.path.join(folder, "mp_rank_00_000", "model_optim_rng.pt"),
                       os.path.join(folder, "mp_rank_01_000", "model_optim_rng.pt")):
            self.assertIn(needle, res.text, self.describe(res))


class MoERefusalTests(Base):

    def test_missing_ep_rank_folder(self):
        model = moe.MoE(train_tp=2, seed=11)
        folder = moe.write(self.p("save"), model, tp=2, pp=1, ep=4)
        shutil.rmtree(os.path.join(folder, "mp_rank_01_002"))
        self.refused(folder, "mp_rank_01_002/model_optim_rng.pt is missing",
                     "experts 4 to 5")

    def test_duplicated_expert(self):
        # EP rank 0 of 2 holds 5 local experts; its local expert 4 is EP rank 1's expert 4.
        model = moe.MoE(train_tp=1, seed=12)
        folder = moe.write(self.p("save"), model, tp=1, pp=1, ep=2,
                           rank_options={"mp_rank_00_000": {"extra_expert": True}})
        self.refused(folder, "expert 4 of decoder.layers.0.mlp.experts is duplicated",
                     "mp_rank_00_000", "mp_rank_00_001")

    def test_missing_expert(self):
        model = moe.MoE(train_tp=1, seed=13)
        folder = moe.write(self.p("save"), model, tp=1, pp=1, ep=2, grouped=True,
                           rank_options={"mp_rank_00_001": {"drop_expert": 2}})
        self.refused(folder, "expert 6 of decoder.layers.0.mlp.experts is missing",
                     "mp_rank_00_001 has no local expert 2")

    def test_mixed_saves(self):
        model = moe.MoE(train_tp=2, seed=14)
        folder = moe.write(self.p("save"), model, tp=2, pp=1, ep=2,
                           rank_iteration={"mp_rank_01_001": 90})
        self.refused(folder, "mp_rank_01_001/model_optim_rng.pt has iteration = 90",
                     "has 100", "not from one checkpoint")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
