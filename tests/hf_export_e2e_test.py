"""End-to-end tests of `reshardctl consolidate IN OUT --format hf` (lib/formats/hf): Megatron-LM
TP x PP (and Megatron-Core torch_dist) checkpoints of Llama, Mistral, Qwen2 and Qwen3 models,
written with real torch by
tests/fixtures/hf_megatron_fixture.py from a known Hugging Face state dict, exported back to a
Hugging Face folder.

Run:  /usr/bin/python3 tests/hf_export_e2e_test.py --reshardctl PATH [unittest args]

The expected tensors are the HF state dict the fixture started from (its Megatron layout is made
by the fixture's numpy code, never by reshard), cut to the true vocabulary; the output's
safetensors files are read by the independent reader (st_reference.py through st_torch.py) and
compared element by element (torch.equal). config.json is checked key by key against the names
and JSON types of transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config as
transformers' documentation gives them: no transformers package is installed here, so the
config is not loaded by transformers itself.
"""

import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import hf_megatron_fixture as hmf  # noqa: E402
from st_torch import read_file as st_tensors  # noqa: E402

# config.json keys every family's config class takes, with their JSON types (transformers'
# documentation of LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config).
COMMON_KEYS = {
    "architectures": list, "model_type": str, "hidden_size": int, "intermediate_size": int,
    "num_hidden_layers": int, "num_attention_heads": int, "num_key_value_heads": int,
    "head_dim": int, "hidden_act": str, "max_position_embeddings": int, "rms_norm_eps": float,
    "rope_theta": float, "rope_scaling": (dict, type(None)), "vocab_size": int,
    "tie_word_embeddings": bool, "torch_dtype": str, "use_cache": bool,
}
FAMILY_KEYS = {
    "llama": {"attention_bias": bool},
    "mistral": {"sliding_window": (int, type(None))},
    "qwen2": {"attention_bias": bool},
    "qwen3": {"attention_bias": bool},
}
ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-hf"
    TIMEOUT = 60

    def export(self, folder, out, *args):
        res = self.ctl("consolidate", folder, out, "--format", "hf", "--no-progress", *args)
        self.assertExit(res, 0)
        return res

    def refused(self, folder, out, args, message):
        """Exit 3, the message holds `message`, and OUT is not created."""
        res = self.ctl("consolidate", folder, out, "--format", "hf", "--no-progress", *args)
        self.assertExit(res, 3)
        self.assertIn(message, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused export" % out)

    def read_output(self, out):
        """Every tensor of the output folder, through its index when sharded."""
        index = os.path.join(out, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        tensors = {}
        for name in files:
            for key, value in st_tensors(os.path.join(out, name)).items():
                self.assertNotIn(key, tensors, "%s in two files" % key)
                tensors[key] = value
        return tensors

    def read_json(self, out, name):
        with open(os.path.join(out, name)) as f:
            return json.load(f)

    def check_tensors(self, out, hf, dtype=torch.float32):
        got = self.read_output(out)
        self.assertEqual(sorted(got), sorted(hf), "tensor names")
        for name, want in hf.items():
            want = torch.from_numpy(want).to(dtype)
            self.assertEqual(got[name].dtype, dtype, name)
            self.assertEqual(tuple(got[name].shape), tuple(want.shape), name)
            self.assertTrue(torch.equal(got[name], want), "%s differs" % name)

    def check_config(self, out, spec, dtype="float32", rope_scaling=None):
        config = self.read_json(out, "config.json")
        keys = dict(COMMON_KEYS, **FAMILY_KEYS[spec.family])
        self.assertEqual(sorted(config), sorted(keys), "config.json keys")
        for key, kind in keys.items():
            self.assertIsInstance(config[key], kind, key)
        want = {
            "architectures": [ARCHITECTURE[spec.family]], "model_type": spec.family,
            "hidden_size": spec.hidden, "intermediate_size": spec.ffn,
            "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.groups, "head_dim": spec.head_dim, "hidden_act": "silu",
            "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
            "rope_scaling": rope_scaling, "vocab_size": spec.vocab,
            "tie_word_embeddings": spec.tied, "torch_dtype": dtype, "use_cache": True,
        }
        if spec.family == "mistral":
            want["sliding_window"] = 4096
        else:
            want["attention_bias"] = spec.family == "qwen2"
        self.assertEqual(config, want)
        self.assertEqual(self.read_json(out, "generation_config.json"),
                         {"_from_model_config": True})


class FamilyTests(Base):
    def run_case(self, spec, tp, pp, flags=(), arg_overrides=None, dtype=torch.float32,
                 rope_scaling=None):
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_megatron_lm(self.p("save"), spec, hf, tp, pp, **(arg_overrides or {}))
        out = self.p("out")
        self.export(folder, out, *flags)
        self.check_tensors(out, hf, dtype)
        self.check_config(out, spec, {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype],
                          rope_scaling)
        # inspect says which family --family auto picks, and why.
        doc = self.inspect_json(folder)
        why = {"llama": "no q/k norms, QKV bias or sliding window",
               "mistral": "a sliding window", "qwen2": "a QKV bias", "qwen3": "q/k norms"}
        self.assertTrue(doc.get("result", doc)["description"].endswith(
            "; --format hf --family auto: %s (%s)" % (spec.family, why[spec.family])),
            doc.get("result", doc)["description"])
        return out

    def test_llama_gqa_tp2_pp2_untied_padded_vocab(self):
        # 50 rows padded to 64 for TP 2; the true size from --vocab-size.
        self.run_case(hmf.Spec("llama", layers=4, groups=2, tied=False), 2, 2,
                      ["--vocab-size", "50"])

    def test_llama_single_group_tied_tp1(self):
        self.run_case(hmf.Spec("llama", groups=1, tied=True, seed=3), 1, 1,
                      ["--vocab-size", "50"])

    def test_llama31_rope_scaling_bf16_sharded(self):
        spec = hmf.Spec("llama", groups=2, seed=4)
        out = self.run_case(spec, 2, 1, ["--dtype", "bf16", "--max-shard-size", "4KB"],
                            {"vocab_size": 50, "use_rope_scaling": True,
                             "rope_scaling_factor": 8.0}, torch.bfloat16,
                            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
        index = self.read_json(out, "model.safetensors.index.json")
        self.assertGreater(len(set(index["weight_map"].values())), 1)

    def test_mistral_multi_head_tp4(self):
        # ng = nh: every head its own group; vocabulary from args.vocab_size.
        self.run_case(hmf.Spec("mistral", groups=4, seed=5), 4, 1, [], {"vocab_size": 50})

    def test_qwen2_qkv_bias_tp2_tied(self):
        self.run_case(hmf.Spec("qwen2", groups=2, tied=True, seed=6), 2, 1,
                      ["--vocab-size", "50"])

    def test_qwen3_qk_norm_head_dim_tp2_pp2(self):
        # head_dim 8 while hidden / heads is 4.
        self.run_case(hmf.Spec("qwen3", layers=4, groups=2, head_dim=8, seed=7), 2, 2,
                      ["--vocab-size", "50"])


class TorchDistTests(Base):
    """Megatron-Core torch_dist input: TE names, layer-stacked tensors, args in common.pt."""

    def test_qwen2_torch_dist_tp2_pp2(self):
        spec = hmf.Spec("qwen2", layers=4, groups=2, seed=8)
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_torch_dist(self.p("save"), spec, hf, 2, 2)
        out = self.p("out")
        self.export(folder, out, "--vocab-size", "50")
        self.check_tensors(out, hf)
        self.check_config(out, spec)

    def test_qwen3_torch_dist_tp2(self):
        spec = hmf.Spec("qwen3", groups=2, head_dim=8, seed=9)
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_torch_dist(self.p("save"), spec, hf, 2, 1, vocab_size=50)
        out = self.p("out")
        self.export(folder, out)
        self.check_tensors(out, hf)
        self.check_config(out, spec)


class RefusalTests(Base):
    def checkpoint(self, spec=None, tp=2, pp=1, **arg_overrides):
        spec = spec or hmf.Spec("llama", groups=2)
        hf = hmf.hf_state_dict(spec)
        return hmf.write_megatron_lm(self.p("save"), spec, hf, tp, pp, **arg_overrides)

    def test_unknown_family_lists_the_families_and_flags(self):
        self.refused(self.checkpoint(), self.p("out"), ["--family", "falcon", "--vocab-size", "50"],
                     "unknown model family \"falcon\" for --format hf; the families are llama, "
                     "mistral, qwen2, qwen3 (--family F picks one, --family auto decides from the "
                     "checkpoint; --config FILE overrides what the args say)")

    def test_heads_not_divisible_by_groups(self):
        config = self.p("config.json")
        with open(config, "w") as f:
            json.dump({"num_key_value_heads": 3}, f)
        self.refused(self.checkpoint(), self.p("out"), ["--config", config, "--vocab-size", "50"],
                     "num_attention_heads 4 is not divisible by num_key_value_heads 3")

    def test_args_disagreeing_with_shapes(self):
        self.refused(self.checkpoint(ffn_hidden_size=32), self.p("out"), ["--vocab-size", "50"],
                     "tensor \"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight\" has "
                     "shape [48, 16], but config.json (hidden_size 16, num_attention_heads 4, "
                     "num_key_value_heads 2, head_dim 4, intermediate_size 32) makes it [64, 16]")

    def test_missing_args_without_config_then_with_config(self):
        folder = self.checkpoint(rotary_base=None)
        self.refused(folder, self.p("out"), [],
                     "config.json needs rope_theta (from args.rotary_base), vocab_size (from "
                     "--vocab-size or args.vocab_size), which the checkpoint's args do not record")
        config = self.p("config.json")
        with open(config, "w") as f:
            json.dump({"rope_theta": 500000.0, "vocab_size": 50}, f)
        out = self.p("out")
        self.export(folder, out, "--config", config)
        self.check_config(out, hmf.Spec("llama", groups=2))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
