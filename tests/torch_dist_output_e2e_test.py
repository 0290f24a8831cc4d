"""End-to-end tests of reshard's Megatron-Core torch_dist writer (--format megatron-torch-dist)
against checkpoints written with real torch.

Run:  /usr/bin/python3 tests/torch_dist_output_e2e_test.py --reshardctl PATH [unittest args]

The input is a Llama-style GPT (GQA: 4 heads in 2 query groups, SwiGLU, untied output layer,
vocabulary 50 padded to 64) written by tests/fixtures/hf_megatron_fixture.py from a known
Hugging Face state dict, as a Megatron-LM TP 2 x PP 2 checkpoint (write_megatron_lm) or as a
Megatron-Core torch_dist one (write_torch_dist), or a GPT-2 style one saved by
Megatron-DeepSpeed's pipeline engine (tests/fixtures/megatron_fixture.py). The expected output tensors are the
fixture's numpy reference of Megatron-Core's keys (megatron_core_tensors: layers stacked,
fused QKV per group, fc1 the global [gate; up]), never reshard's code. The output is read back
with real torch: common.pt by torch.load, `.metadata` by the strict unpickler of
tests/dcp_output_test.py and every chunk by torch.load of its byte range; tensors are compared
element by element (torch.equal). No Megatron-Core is installed here, so the output is not
loaded by Megatron-Core itself.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_output_test as O  # noqa: E402
import hf_megatron_fixture as hmf  # noqa: E402
import megatron_fixture as mf  # noqa: E402
from st_torch import read_file as st_tensors  # noqa: E402

ITER = "iter_0000100"
METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                 "common_backend": "torch", "common_backend_version": 1}
# Megatron-LM's layer tensor names -> Megatron-Core's (tests/fixtures/hf_megatron_fixture.py).
LEGACY_TO_CORE = hmf.LEGACY_TO_CORE


def core_name(legacy):
    """A merged Megatron-LM name as reshard's torch_dist reader names the tensor back."""
    outside = {"language_model.embedding.word_embeddings.weight":
               "embedding.word_embeddings.weight",
               "language_model.embedding.position_embeddings.weight":
               "embedding.position_embeddings.weight",
               "language_model.encoder.final_layernorm.weight": "decoder.final_layernorm.weight",
               "language_model.encoder.final_layernorm.bias": "decoder.final_layernorm.bias",
               "language_model.output_layer.weight": "output_layer.weight"}
    if legacy in outside:
        return outside[legacy]
    _, _, rest = legacy.partition("language_model.encoder.layers.")
    layer, _, key = rest.partition(".")
    return "decoder.layers.%s.%s" % (layer, LEGACY_TO_CORE[key])


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-torch-dist-out"
    TIMEOUT = 60

    def setUp(self):
        super().setUp()
        self.spec = hmf.Spec("llama", layers=4, groups=2, tied=False, seed=11)
        self.hf = hmf.hf_state_dict(self.spec)
        # Trained at TP 2: 50 rows padded to 64.
        self.expected = hmf.megatron_core_tensors(self.spec, self.hf, 2)

    def legacy(self):
        save = self.p("legacy")
        hmf.write_megatron_lm(save, self.spec, self.hf, 2, 2)
        return save

    def convert(self, command, src, out, *args):
        res = self.ctl(command, src, out, "--format", "megatron-torch-dist", "--no-progress", *args)
        self.assertExit(res, 0)
        return os.path.join(out, ITER)

    def files(self, out):
        found = []
        for root, _, names in os.walk(out):
            found += [os.path.relpath(os.path.join(root, n), out) for n in names]
        return sorted(found)

    def check_tensors(self, folder, expected):
        md, got = O.read_dcp(folder)  # checks every tensor's chunks tile it exactly once
        self.assertEqual(list(got), list(expected), "keys, in Megatron-Core's order")
        for key, want in expected.items():
            self.assertEqual(got[key].dtype, want.dtype, key)
            self.assertEqual(tuple(got[key].shape), tuple(want.shape), key)
            self.assertTrue(torch.equal(got[key], want), "%s differs" % key)
        # Flat keys, as Megatron-Core's torch_dist strategy saves them (fqn = key).
        self.assertEqual(md.planner_data, {key: (key,) for key in expected})
        return md

    def chunks(self, md, key):
        entry = md.state_dict_metadata[key]
        return [(tuple(c.offsets), tuple(c.sizes),
                 md.storage_data[O.MetadataIndex_(key, c.offsets)].relative_path)
                for c in entry.chunks]


class TorchDistOutputTests(Base):
    def test_legacy_tp2_pp2_to_torch_dist_read_back_with_torch(self):
        out = self.p("out")
        folder = self.convert("consolidate", self.legacy(), out)
        self.assertEqual(self.files(out), [
            "%s/%s" % (ITER, n) for n in (".metadata", "__0_0.distcp", "common.pt",
                                          "metadata.json")] + [
            "latest_checkpointed_iteration.txt", "reshard-manifest.json"])
        with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
            self.assertEqual(f.read(), "100")
        with open(os.path.join(folder, "metadata.json")) as f:
            self.assertEqual(json.load(f), METADATA_JSON)
        common = torch.load(os.path.join(folder, "common.pt"), map_location="cpu")
        self.assertEqual(list(common), ["args", "checkpoint_version", "iteration"])
        self.assertEqual(common["iteration"], 100)
        self.assertEqual(common["checkpoint_version"], 3.0)
        args = common["args"]
        self.assertIsInstance(args, argparse.Namespace)
        self.assertEqual((args.num_layers, args.hidden_size, args.num_query_groups,
                          args.padded_vocab_size), (4, 16, 2, 64))
        self.assertEqual((args.tensor_model_parallel_size, args.pipeline_model_parallel_size),
                         (1, 1))
        md = self.check_tensors(folder, self.expected)
        self.assertEqual(self.chunks(md, "decoder.layers.mlp.linear_fc1.weight"),
                         [((0, 0, 0), (4, 48, 16), "__0_0.distcp")])

    def test_reshard_into_two_ranks_chunks_fc1_by_gate_and_up(self):
        out = self.p("out")
        folder = self.convert("reshard", self.legacy(), out, "--parts", "2")
        self.assertEqual([n for n in self.files(out) if n.endswith(".distcp")],
                         ["%s/__0_0.distcp" % ITER, "%s/__1_0.distcp" % ITER])
        md = self.check_tensors(folder, self.expected)
        # Rank r: its gate rows [12r, 12r + 12) and its up rows [24 + 12r, ...) of [gate; up].
        self.assertEqual(self.chunks(md, "decoder.layers.mlp.linear_fc1.weight"), [
            ((0, 0, 0), (4, 12, 16), "__0_0.distcp"), ((0, 24, 0), (4, 12, 16), "__0_0.distcp"),
            ((0, 12, 0), (4, 12, 16), "__1_0.distcp"), ((0, 36, 0), (4, 12, 16), "__1_0.distcp")])
        self.assertEqual(self.chunks(md, "decoder.layers.self_attention.linear_proj.weight"), [
            ((0, 0, 0), (4, 16, 8), "__0_0.distcp"), ((0, 0, 8), (4, 16, 8), "__1_0.distcp")])
        self.assertEqual(self.chunks(md, "decoder.final_layernorm.weight"),
                         [((0,), (16,), "__0_0.distcp")])
        # A TP 4 rank's box, as Megatron-Core's load planner reads it from the overlapping chunks.
        box = O.load_box(folder, md, "decoder.layers.mlp.linear_fc1.weight", [1, 30, 0],
                         [2, 6, 16])
        self.assertTrue(torch.equal(box, self.expected[
            "decoder.layers.mlp.linear_fc1.weight"][1:3, 30:36]))
        common = torch.load(os.path.join(folder, "common.pt"), map_location="cpu")
        self.assertEqual(common["args"].tensor_model_parallel_size, 2)

    def test_safetensors_and_hf_from_it_equal_those_from_the_legacy_checkpoint(self):
        legacy = self.legacy()
        out = self.p("out")
        self.convert("consolidate", legacy, out)
        for src, name in ((legacy, "legacy"), (out, "core")):
            self.ok("consolidate", src, self.p(name + "_st"), "--format", "safetensors",
                    "--no-progress")
            self.ok("consolidate", src, self.p(name + "_hf"), "--format", "hf", "--vocab-size",
                    "50", "--no-progress")
        from_legacy = st_tensors(self.p("legacy_st", "model.safetensors"))
        from_core = st_tensors(self.p("core_st", "model.safetensors"))
        self.assertEqual(sorted(core_name(n) for n in from_legacy), sorted(from_core))
        for name, tensor in from_legacy.items():
            self.assertTrue(torch.equal(from_core[core_name(name)], tensor), name)
        legacy_hf = st_tensors(self.p("legacy_hf", "model.safetensors"))
        core_hf = st_tensors(self.p("core_hf", "model.safetensors"))
        self.assertEqual(sorted(legacy_hf), sorted(core_hf))
        for name, tensor in legacy_hf.items():
            self.assertTrue(torch.equal(core_hf[name], tensor), name)
        for config in ("config.json", "generation_config.json"):
            with open(self.p("legacy_hf", config)) as a, open(self.p("core_hf", config)) as b:
                self.assertEqual(json.load(a), json.load(b), config)

    def test_torch_dist_round_trip_keeps_every_tensor(self):
        # A Megatron-Core torch_dist checkpoint saved at TP 2 x PP 2, written again.
        src = self.p("src")
        hmf.write_torch_dist(src, self.spec, self.hf, 2, 2)
        out = self.p("out")
        folder = self.convert("consolidate", src, out)
        self.check_tensors(folder, self.expected)
        again = self.convert("consolidate", out, self.p("again"))
        self.check_tensors(again, self.expected)
        common = torch.load(os.path.join(again, "common.pt"), map_location="cpu")
        self.assertEqual((common["iteration"], common["args"].num_layers), (100, 4))


    def test_megatron_deepspeed_pipe_tp2_pp2_to_two_ranks(self):
        # GPT-2 style (LayerNorm and linear biases, learned positions, GeLU), tied embeddings,
        # saved by Megatron-DeepSpeed's pipeline engine; the expected keys stack the fixture's
        # full Megatron-LM tensors layer by layer.
        model = mf.GPT(layers=4, hidden=16, heads=4, train_tp=2, seed=5)
        save = self.p("save")
        mf.write_deepspeed_pipe(save, model, 2, 2)
        expected = {}
        for name, tensor in mf.full_tensors(model).items():
            core = core_name(name)
            parts = core.split(".")
            if parts[:2] == ["decoder", "layers"]:
                key = ".".join(parts[:2] + parts[3:])
                expected.setdefault(key, []).append(tensor)
            else:
                expected[core] = tensor
        expected = {k: torch.stack(v) if isinstance(v, list) else v for k, v in expected.items()}
        order = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"] + [
            "decoder.layers." + LEGACY_TO_CORE[k] for k in mf.layer_rank(model, 0, 0, 1)] + [
            "decoder.final_layernorm.weight", "decoder.final_layernorm.bias"]
        folder = self.convert("reshard", save, self.p("out"), "--parts", "2")
        md = self.check_tensors(folder, {key: expected[key] for key in order})
        # GeLU: fc1 rows split in two, one chunk per rank.
        self.assertEqual(self.chunks(md, "decoder.layers.mlp.linear_fc1.bias"), [
            ((0, 0), (4, 32), "__0_0.distcp"), ((0, 32), (4, 32), "__1_0.distcp")])


class TorchDistOutputRefusalTests(Base):
    def test_non_megatron_input_is_refused_naming_its_format(self):
        legacy = self.legacy()
        st = self.p("st")
        self.ok("consolidate", legacy, st, "--format", "safetensors", "--no-progress")
        pt = self.p("pt")
        self.ok("consolidate", legacy, pt, "--format", "torch", "--no-progress")
        out = self.p("out")
        # A safetensors model is taken as a Hugging Face model, which needs its config.json.
        res = self.ctl("consolidate", st, out, "--format", "megatron-torch-dist", "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("presenting the input to the megatron-torch-dist output: %s not found: a "
                      "Hugging Face model is imported" % os.path.join(st, "config.json"),
                      res.text, self.describe(res))
        self.assertIn("other input must be a Megatron checkpoint", res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused conversion" % out)
        # So is a folder of torch.save files named as save_pretrained names them
        # (pytorch_model.bin, which the torch output writes).
        res = self.ctl("consolidate", pt, out, "--format", "megatron-torch-dist", "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("presenting the input to the megatron-torch-dist output: %s not found: a "
                      "Hugging Face model is imported" % os.path.join(pt, "config.json"),
                      res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused conversion" % out)
        # Other torch.save files are no Hugging Face model: refused naming their format.
        other = self.p("other")
        os.makedirs(other)
        os.rename(os.path.join(pt, "pytorch_model.bin"), os.path.join(other, "model.pt"))
        res = self.ctl("consolidate", other, out, "--format", "megatron-torch-dist",
                       "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("the megatron-torch-dist output writes Megatron-Core checkpoints from "
                      "Megatron input (Megatron-LM, Megatron-DeepSpeed or Megatron-Core "
                      "torch_dist: its args, iteration and layers) or from a Hugging Face model "
                      "(one safetensors model and its config.json), not from torch input",
                      res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused conversion" % out)

    def test_parts_splitting_a_query_group_is_refused(self):
        out = self.p("out")
        res = self.ctl("reshard", self.legacy(), out, "--parts", "4", "--format",
                       "megatron-torch-dist", "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("its 2 units of 16 rows along dimension 0 (attention heads or head groups, "
                      "for Megatron's query_key_value) cannot be shared evenly by 4 parts",
                      res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused conversion" % out)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
