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
  * refusals (exit 3, message names what is wrong, OUT not created).
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
from st_torch import read_file as st_tensors  # noqa: E402

RESHARDCTL = None
L = mf.ENCODER + "layers."


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-megatron"
    TIMEOUT = 120

    def ok(self, *args):
        progress = [] if args[0] == "inspect" else ["--no-progress"]
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
            self.assertEqual(doc["description"], "Megatron-LM TP2 x PP2, 4 layers, iteration 100")
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
                         "Megatron-LM TP2 x PP1, 4 layers, iteration 100")
        rel = self.p("rel")
        mf.write_megatron_lm(rel, old, tp=2, pp=1, release=True)
        self.assertEqual(self.inspect(rel)["description"],
                         "Megatron-LM TP2 x PP1, 4 layers, release")
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
                         "Megatron-LM TP2 x PP2 x 2 virtual stages, 8 layers, iteration 100")
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
                         "iteration 100, tag global_step100")
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


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
