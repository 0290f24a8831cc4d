"""End-to-end tests of reshard's Megatron reader (lib/formats/megatron) against Megatron-LM and
Megatron-DeepSpeed checkpoints written with real PyTorch by tests/fixtures/megatron_fixture.py.

Run:  /usr/bin/python3 tests/megatron_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]

Every expected tensor comes from the fixture's logical model split with Megatron's own rules
(per-head query_key_value, [gate_i; up_i] SwiGLU, padded vocabulary), never from reshard, and is
compared element by element (torch.equal):
  * TP2 x PP2 -> consolidate (safetensors and --format torch) = the full tensors; stage-local
    layer numbers renumbered; the last stage's tied word_embeddings_for_head left out;
  * TP1 -> reshard --parts 4 = Megatron's TP4 slicing; the 4 parts consolidated back = the full;
  * SwiGLU (from args, and from shapes alone), untied output layer, older `transformer` naming,
    virtual pipeline stages, release / --tag / tracker selection;
  * the DeepSpeed pipeline layout (layer files + mp_rank model states), TP2 -> 1 and -> 4;
  * refusals (exit 3, message names what is wrong, OUT not created);
  * the writer (`--format megatron`, MegatronOutputTests): TP2 x PP2 -> 4x1, 1x2, 2x4, 2x1,
    1x1 (consolidate), SwiGLU, untied, GQA, `transformer` naming, release, virtual stages in,
    DeepSpeed pipeline in, the vocabulary padded again (zero rows) and back; every rank file
    against Megatron's own layout at that TP x PP, args updated, read back by reshard.
"""

import argparse
import copy
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
from st_torch import read_file as st_tensors  # noqa: E402

RESHARDCTL = None
L = mf.ENCODER + "layers."
# What `inspect` adds for these GPT-style fixtures (LayerNorm biases): the family
# `--format hf --family auto` would pick, and why.
GPT2_FAMILY_NOTE = "; --format hf --family auto: gpt2 (LayerNorm biases or learned position embeddings)"


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-megatron"
    TIMEOUT = 120

    def ok(self, *args):
        progress = [] if args[0] in ("inspect", "plan") else ["--no-progress"]
        res = self.ctl(*(list(args) + progress))
        self.assertExit(res, 0)
        return res

    def refused(self, args, *needles):
        """The command exits 3, its message holds every needle, and OUT is not created."""
        out = args[2]
        res = self.ctl(*(list(args) + ["--no-progress"]))
        self.assertExit(res, 3)
        for needle in needles:
            self.assertIn(needle, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused command" % out)
        return res

    def inspect(self, path, *args):
        res = self.ok("inspect", path, "--json", *args)
        doc = json.loads(res.stdout.decode("utf-8"))
        return doc.get("result", doc)

    def consolidate_st(self, src, *args):
        out = self.p("out-st-%d" % len(os.listdir(self.tmp)))
        self.ok("consolidate", src, out, *args)
        return st_tensors(os.path.join(out, "model.safetensors"))

    def consolidate_pt(self, src, *args):
        out = self.p("out-pt-%d" % len(os.listdir(self.tmp)))
        self.ok("consolidate", src, out, "--format", "torch", *args)
        return torch.load(os.path.join(out, "pytorch_model.bin"), map_location="cpu",
                          weights_only=True)

    def assertTensorsEqual(self, got, want, what=""):
        self.assertEqual(sorted(got), sorted(want), "%s: names differ" % what)
        for name, w in want.items():
            g = got[name]
            self.assertEqual(g.dtype, w.dtype, "%s %s dtype" % (what, name))
            self.assertEqual(tuple(g.shape), tuple(w.shape), "%s %s shape" % (what, name))
            self.assertTrue(torch.equal(g, w.contiguous()), "%s %s: values differ" % (what, name))


# ---------------------------------------------------------------------------- Megatron-LM

class MegatronLMTests(Base):

    def test_tp2_pp2_consolidate_safetensors(self):
        model = mf.GPT(train_tp=2, seed=1)
        mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        # The save folder: the tracker file picks iter_0000100.
        got = self.consolidate_st(self.p("save"))
        self.assertTensorsEqual(got, mf.full_tensors(model), "TP2xPP2 -> safetensors")
        self.assertEqual(got["language_model.embedding.word_embeddings.weight"].shape[0], 64,
                         "padded vocabulary rows kept")
        self.assertNotIn("word_embeddings_for_head.weight", got)

    def test_tp2_pp2_consolidate_torch(self):
        model = mf.GPT(train_tp=2, seed=2)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        got = self.consolidate_pt(folder)
        want = mf.full_tensors(model)
        self.assertEqual(list(got), list(want), "names or their order (stage order) differ")
        self.assertTensorsEqual(got, want, "TP2xPP2 -> torch")

    def test_pp_stage_renumbering(self):
        model = mf.GPT(layers=8, train_tp=1, seed=3)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=1, pp=4)
        # Each stage file numbers its layers 0 and 1.
        stage2 = torch.load(os.path.join(folder, "mp_rank_00_002", "model_optim_rng.pt"))
        encoder = stage2["model"]["language_model"]["encoder"]
        self.assertEqual(sorted({k.split(".")[1] for k in encoder if k.startswith("layers.")}),
                         ["0", "1"])
        doc = self.inspect(folder)
        want = mf.full_tensors(model)
        self.assertEqual([t["name"] for t in doc["tensors"]], list(want))
        got = self.consolidate_st(folder)
        self.assertTensorsEqual(got, want, "TP1xPP4")
        # Global layer 4 is stage 2's local layer 0.
        for key in ("self_attention.query_key_value.weight", "mlp.dense_4h_to_h.weight"):
            self.assertTrue(torch.equal(got[L + "4." + key], encoder["layers.0." + key]), key)
            self.assertTrue(torch.equal(got[L + "5." + key], encoder["layers.1." + key]), key)

    def test_inspect_json_description(self):
        model = mf.GPT(train_tp=2, seed=4)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        for path in (folder, self.p("save")):
            doc = self.inspect(path)
            self.assertEqual(doc["format"], "megatron")
            self.assertEqual(doc["layout"], "model-parallel-parts")
            self.assertEqual(doc["description"],
                             "Megatron-LM TP2 x PP2, 4 layers, iteration 100" + GPT2_FAMILY_NOTE)
            self.assertEqual(doc["parts"], 2)
            self.assertTrue(doc["merged"])
            self.assertEqual(len(doc["files"]), 4)
            self.assertEqual(doc["tensor_count"], len(mf.full_tensors(model)))
            head = [e for e in doc["other_entries"] if "word_embeddings_for_head" in e]
            self.assertEqual(len(head), 1, doc["other_entries"])
            self.assertIn("left out", head[0])
        text = self.ok("inspect", folder).text
        self.assertIn("Megatron-LM TP2 x PP2, 4 layers, iteration 100", text)

    def test_release_tag_and_tracker(self):
        old, new = mf.GPT(train_tp=2, seed=5), mf.GPT(train_tp=2, seed=6)
        save = self.p("save")
        mf.write_megatron_lm(save, old, tp=2, pp=1, iteration=100)
        mf.write_megatron_lm(save, new, tp=2, pp=1, iteration=200)  # tracker -> 200
        self.assertTensorsEqual(self.consolidate_st(save), mf.full_tensors(new), "tracker")
        for tag in ("iter_0000100", "100"):
            self.assertTensorsEqual(self.consolidate_st(save, "--tag", tag),
                                    mf.full_tensors(old), "--tag %s" % tag)
        self.assertEqual(self.inspect(save, "--tag", "100")["description"],
                         "Megatron-LM TP2 x PP1, 4 layers, iteration 100" + GPT2_FAMILY_NOTE)
        rel = self.p("rel")
        mf.write_megatron_lm(rel, old, tp=2, pp=1, release=True)
        self.assertEqual(self.inspect(rel)["description"],
                         "Megatron-LM TP2 x PP1, 4 layers, release" + GPT2_FAMILY_NOTE)
        self.assertTensorsEqual(self.consolidate_pt(rel), mf.full_tensors(old), "release")
        res = self.ctl("inspect", save, "--tag", "iter_0000300")
        self.assertExit(res, 3)
        self.assertIn("iter_0000300", res.text)
        # Without the tracker: the folders are named and --tag is asked for.
        os.remove(os.path.join(save, "latest_checkpointed_iteration.txt"))
        res = self.ctl("inspect", save)
        self.assertExit(res, 3)
        self.assertIn("iter_0000100, iter_0000200", res.text, self.describe(res))
        self.assertIn("pass --tag", res.text, self.describe(res))
        self.assertTensorsEqual(self.consolidate_st(save, "--tag", "200"),
                                mf.full_tensors(new), "--tag without tracker")
        # A tracker naming a folder that is not there.
        with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("300\n")
        res = self.ctl("inspect", save)
        self.assertExit(res, 3)
        self.assertIn("names iter_0000300", res.text, self.describe(res))

    def test_older_transformer_naming(self):
        model = mf.GPT(train_tp=2, seed=7)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2, encoder_key="transformer")
        self.assertTensorsEqual(self.consolidate_st(folder),
                                mf.full_tensors(model, encoder_key="transformer"), "transformer")

    def test_untied_output_layer(self):
        model = mf.GPT(train_tp=2, tied=False, seed=8)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        got = self.consolidate_st(folder)
        self.assertIn("language_model.output_layer.weight", got)
        self.assertTensorsEqual(got, mf.full_tensors(model), "untied")
        doc = self.inspect(folder)
        self.assertFalse([e for e in doc["other_entries"] if "word_embeddings_for_head" in e])

    def test_virtual_pipeline_stages(self):
        model = mf.GPT(layers=8, train_tp=2, seed=9)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2, vpp=2)
        # PP rank 1's chunk 0 holds global layers 2, 3 (Megatron's interleaving).
        self.assertEqual(mf.vpp_stage_layers(model, 2, 2)[(1, 0)], [2, 3])
        self.assertEqual(self.inspect(folder)["description"],
                         "Megatron-LM TP2 x PP2 x 2 virtual stages, 8 layers, iteration 100" + GPT2_FAMILY_NOTE)
        self.assertTensorsEqual(self.consolidate_st(folder), mf.full_tensors(model), "VPP")

    def test_tp1_reshard_4_and_back(self):
        model = mf.GPT(train_tp=1, seed=10)  # padded vocab 56 = 4 x 14
        folder = mf.write_megatron_lm(self.p("save"), model, tp=1, pp=2)
        parts = self.p("parts")
        self.ok("reshard", folder, parts, "--parts", 4)
        files = sorted(f for f in os.listdir(parts) if f.endswith(".safetensors"))
        self.assertEqual(files, ["model_part-%d.safetensors" % r for r in range(4)])
        for r in range(4):
            self.assertTensorsEqual(st_tensors(os.path.join(parts, files[r])),
                                    mf.megatron_part(model, r, 4), "part %d of 4" % r)
        back = self.consolidate_st(parts, "--rules", "megatron")
        self.assertTensorsEqual(back, mf.full_tensors(model), "4 parts -> 1")

    def test_swiglu(self):
        model = mf.GPT(train_tp=2, swiglu=True, seed=11)
        folder = mf.write_megatron_lm(self.p("tp2"), model, tp=2, pp=2)
        self.assertIn("SwiGLU", self.inspect(folder)["description"])
        self.assertTensorsEqual(self.consolidate_st(folder), mf.full_tensors(model), "SwiGLU TP2")
        # Without args.swiglu (older Megatron): recognized from the shapes.
        bare = mf.write_megatron_lm(self.p("bare"), model, tp=2, pp=2,
                                    args_overrides={"swiglu": mf.delete_arg()})
        self.assertTensorsEqual(self.consolidate_pt(bare), mf.full_tensors(model), "no args.swiglu")
        # TP1 -> 2 parts: every rank holds [gate_r; up_r].
        one = mf.GPT(train_tp=1, swiglu=True, seed=12)
        folder1 = mf.write_megatron_lm(self.p("tp1"), one, tp=1, pp=1)
        parts = self.p("parts")
        self.ok("reshard", folder1, parts, "--parts", 2)
        for r in range(2):
            part = st_tensors(os.path.join(parts, "model_part-%d.safetensors" % r))
            want = mf.megatron_part(one, r, 2)
            self.assertTensorsEqual(part, want, "SwiGLU part %d" % r)
            gate = one.layer[0]["gate_w"].chunk(2)[r]
            self.assertTrue(torch.equal(part[L + "0.mlp.dense_h_to_4h.weight"][:gate.shape[0]],
                                        gate))
        rules = self.p("swiglu-rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [
                {"pattern": r"dense_h_to_4h\.(weight|bias)$", "split_dim": 0, "fused": 2},
                {"pattern": r"word_embeddings\.weight|query_key_value", "split_dim": 0},
                {"pattern": r"(attention\.dense|dense_4h_to_h)\.weight", "split_dim": 1},
                {"pattern": r"\.bias$|layernorm|position_embeddings", "replicate": True}]}, f)
        back = self.consolidate_st(parts, "--rules", rules)
        self.assertTensorsEqual(back, mf.full_tensors(one), "SwiGLU 2 parts -> 1")


# ---------------------------------------------------------------------------- DeepSpeed pipe

class DeepSpeedPipeTests(Base):

    def test_tp2_pp2_consolidate(self):
        model = mf.GPT(train_tp=2, seed=20)
        folder = mf.write_deepspeed_pipe(self.p("save"), model, tp=2, pp=2)
        want = mf.ds_full_tensors(model)
        self.assertIn("8.weight", want)
        got = self.consolidate_st(self.p("save"))  # `latest` -> global_step100
        self.assertTensorsEqual(got, want, "pipe TP2 -> safetensors")
        self.assertNotIn("9.word_embeddings.weight", got, "tied copy kept")
        got_pt = self.consolidate_pt(folder)
        self.assertEqual(list(got_pt), list(want))
        self.assertTensorsEqual(got_pt, want, "pipe TP2 -> torch")

    def test_inspect(self):
        model = mf.GPT(train_tp=2, seed=21)
        folder = mf.write_deepspeed_pipe(self.p("save"), model, tp=2, pp=2)
        doc = self.inspect(folder)
        self.assertEqual(doc["format"], "megatron")
        self.assertEqual(doc["parts"], 2)
        self.assertEqual(doc["description"],
                         "Megatron-DeepSpeed pipeline TP2 x PP2, 4 layers in 7 layer files, "
                         "iteration 100, tag global_step100; --format hf --family auto: gpt2 "
                         "(LayerNorm biases or learned position embeddings)")
        tied = [e for e in doc["other_entries"] if e.startswith("9.*")]
        self.assertEqual(len(tied), 1, doc["other_entries"])
        self.assertIn("left out", tied[0])
        # 7 layer files x 2 TP ranks, the tied copy not among them.
        self.assertEqual(len(doc["files"]), 12)

    def test_reshard_tp2_to_4(self):
        model = mf.GPT(train_tp=2, seed=22)
        folder = mf.write_deepspeed_pipe(self.p("save"), model, tp=2, pp=1)
        parts = self.p("parts")
        self.ok("reshard", folder, parts, "--parts", 4)
        for r in range(4):
            self.assertTensorsEqual(st_tensors(os.path.join(parts, "model_part-%d.safetensors" % r)),
                                    mf.ds_part(model, r, 4), "pipe part %d of 4" % r)

    def test_swiglu_and_untied(self):
        model = mf.GPT(train_tp=2, swiglu=True, tied=False, seed=23)
        folder = mf.write_deepspeed_pipe(self.p("save"), model, tp=2, pp=2)
        want = mf.ds_full_tensors(model)
        self.assertIn("9.lm_head.weight", want)
        self.assertTensorsEqual(self.consolidate_st(folder), want, "pipe SwiGLU untied")


    def test_zero_folder_beside_latest_is_not_claimed(self):
        """Megatron-DeepSpeed without pipelining (ZeRO files only) belongs to the ZeRO reader,
        although the save folder also holds latest_checkpointed_iteration.txt."""
        save = self.p("save")
        os.makedirs(os.path.join(save, "global_step100"))
        torch.save({"module": {"language_model.embedding.word_embeddings.weight":
                               torch.ones(8, 4)}, "args": mf.megatron_args(mf.GPT(), 1, 1)},
                   os.path.join(save, "global_step100", "mp_rank_00_model_states.pt"))
        for name, text in (("latest", "global_step100"),
                           ("latest_checkpointed_iteration.txt", "100")):
            with open(os.path.join(save, name), "w") as f:
                f.write(text)
        res = self.ctl("inspect", save, "--json")
        if res.returncode == 0:
            self.assertNotEqual(json.loads(res.stdout.decode())["format"], "megatron")
        self.assertNotIn("Megatron", res.text, self.describe(res))


# ---------------------------------------------------------------------------- refusals

class RefusalTests(Base):

    def test_missing_mp_rank_folder(self):
        folder = mf.write_megatron_lm(self.p("save"), mf.GPT(train_tp=2), tp=2, pp=2)
        shutil.rmtree(os.path.join(folder, "mp_rank_01_001"))
        self.refused(["consolidate", folder, self.p("out")],
                     "Megatron TP2 x PP2: mp_rank_01_001/model_optim_rng.pt is missing")
        os.remove(os.path.join(folder, "mp_rank_00_001", "model_optim_rng.pt"))
        self.refused(["consolidate", self.p("save"), self.p("out")],
                     "mp_rank_00_001/model_optim_rng.pt is missing")

    def test_missing_layer_file_for_one_tp_rank(self):
        folder = mf.write_deepspeed_pipe(self.p("save"), mf.GPT(train_tp=2), tp=2, pp=2)
        os.remove(os.path.join(folder, "layer_04-model_01-model_states.pt"))
        self.refused(["consolidate", folder, self.p("out")],
                     "layer_04-model_01-model_states.pt is missing")

    def test_args_disagree_between_files(self):
        model = mf.GPT(train_tp=2)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2,
                                      file_args_overrides={"mp_rank_01_001": {"num_layers": 6}})
        self.refused(["consolidate", folder, self.p("out")], "args.num_layers",
                     "mp_rank_01_001/model_optim_rng.pt", "mp_rank_00_000/model_optim_rng.pt")
        ds = mf.write_deepspeed_pipe(
            self.p("ds"), model, tp=2, pp=2,
            file_args_overrides={"mp_rank_03_model_states.pt": {"hidden_size": 32}})
        self.refused(["consolidate", ds, self.p("out")], "args.hidden_size",
                     "mp_rank_03_model_states.pt")

    def test_tp_split_not_dividing_padded_vocab(self):
        # vocab 50 padded to 52 (make_vocab_size_divisible_by 4); 8 heads, so only the
        # vocabulary keeps TP8 from working.
        model = mf.GPT(hidden=16, heads=8, vocab=50, divisible_by=4, train_tp=1)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=1, pp=1)
        self.refused(["reshard", folder, self.p("out"), "--parts", 8],
                     "language_model.embedding.word_embeddings.weight", "size 52",
                     "not divisible into 8 parts")
        self.ok("reshard", folder, self.p("four"), "--parts", 4)

    def test_split_that_would_cut_an_attention_head(self):
        # 2 heads of 12 dims: query_key_value has 72 rows, which 4 parts divide (18 rows each)
        # but not head by head; every other tensor splits evenly, so only the heads refuse.
        model = mf.GPT(hidden=24, heads=2, vocab=50, divisible_by=8, train_tp=1)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=1, pp=1)
        self.refused(["reshard", folder, self.p("out"), "--parts", 4],
                     "query_key_value", "2 units of 36 rows", "cannot be shared evenly by 4")
        # Two parts keep each head whole.
        parts = self.p("parts")
        self.ok("reshard", folder, parts, "--parts", 2)
        for r in range(2):
            self.assertTensorsEqual(st_tensors(os.path.join(parts, "model_part-%d.safetensors" % r)),
                                    mf.megatron_part(model, r, 2), "part %d of 2" % r)

    def test_tensor_without_rule(self):
        model = mf.GPT(train_tp=2)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=1)
        for t in range(2):
            path = os.path.join(folder, "mp_rank_%02d" % t, "model_optim_rng.pt")
            ckpt = torch.load(path)
            ckpt["model"]["language_model"]["encoder"]["layers.1.adapter.weight"] = torch.ones(4)
            torch.save(ckpt, path)
        self.refused(["consolidate", folder, self.p("out")],
                     "language_model.encoder.layers.1.adapter.weight", "matches no partition rule")

    def test_stage_names_disagree_across_tp(self):
        model = mf.GPT(train_tp=2)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        path = os.path.join(folder, "mp_rank_01_001", "model_optim_rng.pt")
        ckpt = torch.load(path)
        del ckpt["model"]["language_model"]["encoder"]["layers.1.mlp.dense_4h_to_h.bias"]
        torch.save(ckpt, path)
        self.refused(["consolidate", folder, self.p("out")], "mp_rank_01_001 lacks tensor",
                     "layers.1.mlp.dense_4h_to_h.bias")

    def test_old_checkpoint_version(self):
        folder = mf.write_megatron_lm(self.p("save"), mf.GPT(train_tp=2), tp=2, pp=1,
                                      checkpoint_version=1.0)
        self.refused(["consolidate", folder, self.p("out")], "checkpoint_version 1.0",
                     "query_key_value")


# ---------------------------------------------------------------------------- writing

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



class MegatronOutputTests(Base):
    """--format megatron: every rank file loaded with torch.load and compared with what
    Megatron-LM holds at the new TP x PP (the fixture's chunk_state: keys and nesting in order,
    values element by element), the args updated and otherwise the input's, then read back by
    reshard's own reader."""

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
                self.assertTensorsEqual(self.consolidate_st(out), full, "%dx%d read back" % (tp, pp))
                with open(os.path.join(out, "reshard-manifest.json")) as f:
                    manifest = json.load(f)
                names = [f["name"] for f in manifest["files"]]
                self.assertIn("latest_checkpointed_iteration.txt", names)
                self.assertIn("iter_0000100/%s/model_optim_rng.pt"
                              % mf.rank_folder(tp - 1, pp - 1, pp), names)
        doc = json.loads(self.ok("inspect", out, "--json").stdout.decode())
        doc = doc.get("result", doc)
        self.assertEqual(doc["description"],
                         "Megatron-LM TP2 x PP4, 8 layers, iteration 100" + GPT2_FAMILY_NOTE)

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
            self.assertTensorsEqual(self.consolidate_st(out),
                                    mf.full_tensors(model, encoder_key="transformer"), "read back")

    def test_grouped_query_attention(self):
        # 8 heads in 2 groups: query_key_value holds [group, 4 queries + key + value, hn] rows.
        model = mf.GPT(hidden=32, heads=8, groups=2, train_tp=2, seed=38)
        folder = mf.write_megatron_lm(self.p("save"), model, tp=2, pp=2)
        in_args = self.input_args(folder)
        for tp, pp in ((1, 2), (2, 1)):
            out = self.reshard(folder, tp, pp)
            self.check_output(out, model, tp, pp, in_args)
            self.assertTensorsEqual(self.consolidate_st(out), mf.full_tensors(model), "read back")
        # 4 ranks would split a group.
        self.refused(["reshard", folder, self.p("no"), "--parts", 4, "--format", "megatron"],
                     "query_key_value")

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
        staged = json.loads(self.ok("plan", folder, "--parts", 1, "--pipeline-parts", 2,
                                    "--format", "megatron", "--json").stdout.decode())
        staged = staged.get("result", staged)
        self.assertEqual(sorted(f["name"] for f in staged["files"]
                                if f["name"].endswith(".pt")),
                         ["iter_0000100/mp_rank_00_%03d/model_optim_rng.pt" % p for p in range(2)])
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
        # Not Megatron input.
        st = self.p("model.safetensors")
        with open(st, "wb") as f:
            f.write(b'\x02\x00\x00\x00\x00\x00\x00\x00{}')
        self.refused(["reshard", st, self.p("o4"), "--parts", 1, "--rules", "megatron",
                      "--format", "megatron"],
                     "other input must be a Megatron checkpoint")

    def test_deepspeed_pipeline_in(self):
        # GPTModelPipe's layer files (1.*, 3..6.*, 8.weight) under Megatron-LM's names.
        for tied in (True, False):
            model = mf.GPT(train_tp=2, tied=tied, swiglu=not tied, seed=39)
            save = self.p("ds-%s" % tied)
            folder = mf.write_deepspeed_pipe(save, model, tp=2, pp=2)
            in_args = torch.load(os.path.join(folder, "mp_rank_00_model_states.pt"))["args"]
            for tp, pp in ((1, 2), (4, 1)):
                out = self.reshard(folder, tp, pp)
                self.check_output(out, model, tp, pp, in_args)
                self.assertTensorsEqual(self.consolidate_st(out), mf.full_tensors(model),
                                        "pipe -> %dx%d read back" % (tp, pp))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
