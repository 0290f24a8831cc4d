"""End-to-end tests of reshard's Megatron-LM writer (`--format megatron`,
lib/formats/megatron/megatron_output.h) against checkpoints written with real PyTorch by
tests/fixtures/megatron_fixture.py.

Run:  /usr/bin/python3 tests/megatron_output_test.py --reshardctl PATH [unittest args]

Every output file is loaded with torch.load and compared, rank by rank, with what Megatron-LM
itself holds at the new TP x PP: the fixture's chunk_state (the `model` entry a Megatron rank
saves, built from the logical model with Megatron's own slicing, stage-local layer numbers and
word_embeddings_for_head), keys and nesting in order, values element by element (torch.equal);
the args updated (TP, PP, padded vocabulary, world size, rank) and otherwise the input's;
iteration and checkpoint_version kept. The output is then read back by reshard's own Megatron
reader and consolidated, which must give the input's full tensors.
"""

import argparse
import collections
import copy
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import megatron_fixture as mf  # noqa: E402
from st_torch import read_file as st_tensors  # noqa: E402

# Args the writer changes; every other one must be the input's.
CHANGED = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "padded_vocab_size",
           "world_size", "rank", "virtual_pipeline_model_parallel_size"}


def repadded(model, rows):
    """The model with its vocabulary tensors cut or zero-padded to `rows` rows."""
    out = copy.copy(model)

    def pad(t):
        if t is None:
            return None
        if rows <= t.shape[0]:
            return t[:rows].clone()
        return torch.cat([t, torch.zeros(rows - t.shape[0], t.shape[1], dtype=t.dtype)], 0)
    out.embed, out.output = pad(model.embed), pad(model.output)
    out.padded_vocab = rows
    return out


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-megatron-out"
    TIMEOUT = 120

    def ok(self, *args):
        progress = [] if args[0] in ("inspect", "plan") else ["--no-progress"]
        res = self.ctl(*(list(args) + progress))
        self.assertExit(res, 0)
        return res

    def refused(self, args, *needles):
        out = args[2]
        res = self.ctl(*(list(args) + ["--no-progress"]))
        self.assertExit(res, 3)
        for needle in needles:
            self.assertIn(needle, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)
        return res

    def assertTreeEqual(self, got, want, path="model"):
        """Same keys in the same order at every level, tensors equal element by element."""
        if isinstance(want, torch.Tensor):
            self.assertIsInstance(got, torch.Tensor, path)
            self.assertEqual(got.dtype, want.dtype, path)
            self.assertEqual(tuple(got.shape), tuple(want.shape), path)
            self.assertTrue(torch.equal(got, want), "%s: values differ" % path)
            return
        self.assertIsInstance(got, dict, path)
        self.assertEqual(list(got), list(want), "%s: keys or their order differ" % path)
        for key in want:
            self.assertTreeEqual(got[key], want[key], "%s.%s" % (path, key))

    def check_output(self, out, model, tp, pp, in_args, iteration=100, release=False,
                     encoder_key="encoder"):
        """Every rank file of OUT against Megatron's own layout at TP x PP."""
        folder = "release" if release else "iter_%07d" % iteration
        with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
            self.assertEqual(f.read(), "release" if release else str(iteration))
        ranks = sorted(os.listdir(os.path.join(out, folder)))
        self.assertEqual(ranks, sorted(mf.rank_folder(t, p, pp)
                                       for t in range(tp) for p in range(pp)))
        per = model.layers // pp
        for t in range(tp):
            for p in range(pp):
                name = mf.rank_folder(t, p, pp)
                path = os.path.join(out, folder, name, "model_optim_rng.pt")
                ckpt = torch.load(path, map_location="cpu")
                self.assertEqual(list(ckpt), ["args", "checkpoint_version", "iteration", "model"],
                                 name)
                self.assertEqual(ckpt["iteration"], iteration, name)
                self.assertEqual(ckpt["checkpoint_version"], 3.0, name)
                want = mf.chunk_state(model, t, tp, p * per, (p + 1) * per, first=p == 0,
                                      last=p == pp - 1, encoder_key=encoder_key)
                self.assertTreeEqual(ckpt["model"], want, name + " model")
                args = ckpt["args"]
                self.assertIsInstance(args, argparse.Namespace, name)
                self.assertEqual(args.tensor_model_parallel_size, tp, name)
                self.assertEqual(args.pipeline_model_parallel_size, pp, name)
                self.assertEqual(args.padded_vocab_size, model.padded_vocab, name)
                self.assertEqual(args.world_size, tp * pp * in_args.data_parallel_size, name)
                self.assertEqual(args.rank, t + tp * in_args.data_parallel_size * p, name)
                self.assertIsNone(args.virtual_pipeline_model_parallel_size, name)
                for key, value in vars(in_args).items():
                    if key not in CHANGED:
                        self.assertEqual(getattr(args, key), value, "%s args.%s" % (name, key))
                self.assertEqual(sorted(vars(args)), sorted(vars(in_args)), name)

    def input_args(self, folder):
        first = sorted(d for d in os.listdir(folder) if d.startswith("mp_rank_"))[0]
        return torch.load(os.path.join(folder, first, "model_optim_rng.pt"))["args"]

    def consolidated(self, src, *args):
        out = self.p("cons-%d" % len(os.listdir(self.tmp)))
        self.ok("consolidate", src, out, *args)
        return st_tensors(os.path.join(out, "model.safetensors"))

    def assertTensorsEqual(self, got, want, what=""):
        self.assertEqual(sorted(got), sorted(want), "%s: names differ" % what)
        for name, w in want.items():
            self.assertTrue(torch.equal(got[name], w.contiguous()), "%s %s" % (what, name))


class MegatronOutputTests(Base):

    def reshard(self, folder, tp, pp=None, *extra):
        out = self.p("out-tp%d-pp%s-%d" % (tp, pp, len(os.listdir(self.tmp))))
        args = ["reshard", folder, out, "--parts", tp, "--format", "megatron"]
        if pp is not None:
            args += ["--pipeline-parts", pp]
        self.ok(*(args + list(extra)))
        return out

    def test_tp2_pp2_to_4x1_1x2_2x4(self):
        model = mf.GPT(layers=8, train_tp=2, seed=31)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        in_args = self.input_args(folder)
        full = mf.full_tensors(model)
        for tp, pp in ((4, 1), (1, 2), (2, 4)):
            with self.subTest(tp=tp, pp=pp):
                out = self.reshard(folder, tp, pp)
                self.check_output(out, model, tp, pp, in_args)
                # reshard reads its own output back: the same model.
                self.assertTensorsEqual(self.consolidated(out), full, "%dx%d read back" % (tp, pp))
                manifest = json.load(open(os.path.join(out, "reshard-manifest.json")))
                names = [f["name"] for f in manifest["files"]]
                self.assertIn("latest_checkpointed_iteration.txt", names)
                self.assertIn("iter_0000100/%s/model_optim_rng.pt"
                              % mf.rank_folder(tp - 1, pp - 1, pp), names)
        doc = json.loads(self.ok("inspect", out, "--json").stdout.decode())
        doc = doc.get("result", doc)
        self.assertEqual(doc["description"], "Megatron-LM TP2 x PP4, 8 layers, iteration 100")

    def test_default_one_stage_and_consolidate_as_tp1(self):
        model = mf.GPT(train_tp=2, seed=32)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        in_args = self.input_args(folder)
        self.check_output(self.reshard(folder, 2), model, 2, 1, in_args)
        out = self.p("one")
        self.ok("consolidate", folder, out, "--format", "megatron")
        self.check_output(out, model, 1, 1, in_args)

    def test_swiglu_untied_older_naming(self):
        model = mf.GPT(train_tp=2, swiglu=True, tied=False, seed=33)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2, encoder_key="transformer")
        in_args = self.input_args(folder)
        for tp, pp in ((1, 2), (4, 1)):
            out = self.reshard(folder, tp, pp)
            self.check_output(out, model, tp, pp, in_args, encoder_key="transformer")
            self.assertTensorsEqual(self.consolidated(out),
                                    mf.full_tensors(model, encoder_key="transformer"), "read back")

    def test_release_and_virtual_stages_in(self):
        model = mf.GPT(layers=8, train_tp=2, seed=34)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2, vpp=2, release=True)
        out = self.reshard(folder, 2, 2)
        self.check_output(out, model, 2, 2, self.input_args(folder), release=True)

    def test_vocabulary_padded_again(self):
        # vocab 50, make_vocab_size_divisible_by 8: 56 rows at TP1, 64 at TP2 and TP4.
        model = mf.GPT(train_tp=1, tied=False, seed=35)
        self.assertEqual(model.padded_vocab, 56)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=1, pp=1,
                                      args_overrides={"vocab_size": 50})
        in_args = self.input_args(folder)
        out = self.reshard(folder, 2, 2)
        wide = repadded(model, 64)
        self.check_output(out, wide, 2, 2, in_args)
        # The 8 appended rows are zeros on the last rank.
        last = torch.load(os.path.join(out, "iter_0000100", "mp_rank_01_000",
                                       "model_optim_rng.pt"))
        emb = last["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]
        self.assertEqual(tuple(emb.shape), (32, 16))
        self.assertTrue(torch.equal(emb[24:], torch.zeros(8, 16)))
        self.assertTrue(torch.equal(emb[:24], model.embed[32:56]))
        # And back to TP1: the padding rows dropped again, 56 rows as the input.
        back = self.reshard(out, 1, 1)
        self.check_output(back, model, 1, 1, in_args)
        # Without args.vocab_size, 56 rows are no multiple of 8 x 2: refused.
        bare = mf.write_megatron_lm(self.p("bare"), model, tp=1, pp=1)
        self.refused(["reshard", bare, self.p("no"), "--parts", 2, "--format", "megatron"],
                     "args.vocab_size", "56")

    def test_plan_predicts_files(self):
        model = mf.GPT(train_tp=2, seed=36)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        res = self.ok("plan", folder, "--parts", 4, "--format", "megatron", "--json")
        doc = json.loads(res.stdout.decode())
        doc = doc.get("result", doc)
        names = sorted(f["name"] for f in doc["files"])
        self.assertIn("iter_0000100/mp_rank_03/model_optim_rng.pt", names)
        self.assertGreater(doc["memory_bytes"], 0)
        out = self.reshard(folder, 4)
        for f in doc["files"]:
            if f["name"].endswith(".pt"):
                self.assertEqual(os.path.getsize(os.path.join(out, f["name"])), f["bytes"],
                                 f["name"])

    def test_refusals(self):
        model = mf.GPT(train_tp=2, seed=37)  # 4 layers, 4 heads
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        self.refused(["reshard", folder, self.p("o1"), "--parts", 1, "--pipeline-parts", 3,
                      "--format", "megatron"], "--pipeline-parts 3", "4 layers")
        # 8 parts would cut the 4 heads.
        self.refused(["reshard", folder, self.p("o2"), "--parts", 8, "--format", "megatron"],
                     "query_key_value")
        self.refused(["reshard", folder, self.p("o3"), "--parts", 2, "--format", "megatron",
                      "--dtype", "bf16"], "--dtype")
        ds = mf.write_deepspeed_pipe(self.p("ds"), model, tp=2, pp=1)
        self.refused(["reshard", ds, self.p("o4"), "--parts", 2, "--format", "megatron"],
                     "Megatron-DeepSpeed pipeline")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
