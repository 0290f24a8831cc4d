"""End-to-end tests of `reshardctl consolidate IN OUT --format hf` (lib/formats/hf): Megatron-LM
TP x PP (and Megatron-Core torch_dist) checkpoints of Llama, Mistral, Qwen2, Qwen3 and GPT-2 models,
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

import argparse
import collections
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import hf_megatron_fixture as hmf  # noqa: E402
import nemo_fixture  # noqa: E402
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
        self.assertRefusedWithoutOutput(
            ["consolidate", folder, out, "--format", "hf", "--no-progress"] + list(args), out, 3,
            message)

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

    def check_config(self, out, spec, dtype="float32", rope_scaling=None, special=None):
        """config.json field by field; `special`: the token ids the tokenizer gives
        ({"bos_token_id": 1, ...}), in config.json and generation_config.json."""
        special = special or {}
        config = self.read_json(out, "config.json")
        keys = dict(COMMON_KEYS, **FAMILY_KEYS[spec.family])
        keys.update({key: int for key in special})
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
        want.update(special)
        self.assertEqual(config, want)
        self.assertEqual(self.read_json(out, "generation_config.json"),
                         dict({"_from_model_config": True}, **special))


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

    def test_llama_gqa_between_tp4_pp2(self):
        # 8 heads in 4 groups (r = 2), one group per TP rank. (ng = 1 cannot be saved at TP 4:
        # Megatron requires TP to divide the groups; it is test_llama_single_group_tied_tp1.)
        self.run_case(hmf.Spec("llama", layers=4, hidden=32, heads=8, groups=4, seed=20), 4, 2,
                      ["--vocab-size", "50"])

    def test_llama_gqa_eight_groups_of_one_tp4(self):
        # ng = nh = 8: every head its own group, two per TP rank.
        self.run_case(hmf.Spec("llama", hidden=32, heads=8, groups=8, tied=True, seed=21), 4, 1,
                      ["--vocab-size", "50"])

    def test_mistral_multi_head_tp4(self):
        # ng = nh: every head its own group; vocabulary from args.vocab_size.
        self.run_case(hmf.Spec("mistral", groups=4, seed=5), 4, 1, [], {"vocab_size": 50})

    def test_qwen2_qkv_bias_tp2_tied(self):
        self.run_case(hmf.Spec("qwen2", groups=2, tied=True, seed=6), 2, 1,
                      ["--vocab-size", "50"])

    def test_llama_gqa_pp3_and_tp2_pp3(self):
        # Three stages of two layers each: stage-local numbers 0, 1 made global 0..5, the
        # embedding in the first stage's files and the final norm and output layer in the last.
        for tp, seed in ((1, 23), (2, 24)):
            with self.subTest(tp=tp):
                spec = hmf.Spec("llama", layers=6, groups=2, tied=False, seed=seed)
                hf = hmf.hf_state_dict(spec)
                folder = hmf.write_megatron_lm(self.p("save-tp%d" % tp), spec, hf, tp, 3)
                out = self.p("out-tp%d" % tp)
                self.export(folder, out, "--vocab-size", "50")
                self.check_tensors(out, hf)
                self.check_config(out, spec)

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

    def test_llama31_rope_scaling_torch_dist_tp4_gqa(self):
        # Every size, the vocabulary and rope_scaling from common.pt's args; 8 heads in 2
        # groups (r = 4) at TP 2 x PP 2, then 4 groups at TP 4.
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for tp, pp, groups in ((2, 2, 2), (4, 1, 4)):
            spec = hmf.Spec("llama", layers=4, hidden=32, heads=8, groups=groups, seed=22)
            hf = hmf.hf_state_dict(spec)
            save = self.p("save-%d-%d" % (tp, pp))
            folder = hmf.write_torch_dist(save, spec, hf, tp, pp, vocab_size=50,
                                          use_rope_scaling=True, rope_scaling_factor=8.0)
            out = self.p("out-%d-%d" % (tp, pp))
            self.export(folder, out)
            self.check_tensors(out, hf)
            self.check_config(out, spec, rope_scaling=rope)

    def test_qwen3_torch_dist_tp2(self):
        spec = hmf.Spec("qwen3", groups=2, head_dim=8, seed=9)
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_torch_dist(self.p("save"), spec, hf, 2, 1, vocab_size=50)
        out = self.p("out")
        self.export(folder, out)
        self.check_tensors(out, hf)
        self.check_config(out, spec)


def gpt2_expected(model):
    """HF GPT-2's tensors from megatron_fixture's logical parameters (Conv1D weights are the
    transposes, c_attn the columns [q | k | v])."""
    want = {"transformer.wte.weight": model.embed[:model.vocab],
            "transformer.wpe.weight": model.pos,
            "transformer.ln_f.weight": model.final_w, "transformer.ln_f.bias": model.final_b}
    for i, p in enumerate(model.layer):
        h = "transformer.h.%d." % i
        want.update({
            h + "ln_1.weight": p["ln1_w"], h + "ln_1.bias": p["ln1_b"],
            h + "attn.c_attn.weight": torch.cat([p["q"], p["k"], p["v"]], 0).t(),
            h + "attn.c_attn.bias": torch.cat([p["qb"], p["kb"], p["vb"]], 0),
            h + "attn.c_proj.weight": p["dense_w"].t(), h + "attn.c_proj.bias": p["dense_b"],
            h + "ln_2.weight": p["ln2_w"], h + "ln_2.bias": p["ln2_b"],
            h + "mlp.c_fc.weight": p["fc1_w"].t(), h + "mlp.c_fc.bias": p["fc1_b"],
            h + "mlp.c_proj.weight": p["fc2_w"].t(), h + "mlp.c_proj.bias": p["fc2_b"]})
    return {k: v.contiguous().numpy() for k, v in want.items()}


class DeepSpeedPipeTests(Base):
    """Megatron-DeepSpeed pipeline input (layer_XX-model_TT-model_states.pt, tensors named
    `<layer spec index>.<key>`, args under Megatron-DeepSpeed's names): the same HF model as
    the expected tensors, and the same output files as the model saved by Megatron-LM."""

    def run_case(self, spec, tp, pp):
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_deepspeed_pipe(self.p("ds"), spec, hf, tp, pp, vocab_size=spec.vocab)
        out = self.p("out")
        self.export(folder, out)
        self.check_tensors(out, hf)
        self.check_config(out, spec)
        doc = self.inspect_json(folder)
        self.assertEqual(doc["hf_export"], {
            "family": spec.family, "note": "exports to Hugging Face as %s (--format hf)" %
            spec.family})
        # The same model saved by Megatron-LM exports to the same bytes (all but the manifest,
        # which describes the input).
        lm = hmf.write_megatron_lm(self.p("lm"), spec, hf, tp, pp, vocab_size=spec.vocab)
        lm_out = self.p("lm-out")
        self.export(lm, lm_out)
        self.assertEqual(sorted(os.listdir(out)), sorted(os.listdir(lm_out)))
        for name in sorted(set(os.listdir(out)) - {"reshard-manifest.json"}):
            with open(os.path.join(out, name), "rb") as a, \
                    open(os.path.join(lm_out, name), "rb") as b:
                self.assertTrue(a.read() == b.read(), "%s differs from Megatron-LM's" % name)

    def test_llama_gqa_tp2_pp2_untied_padded_vocab(self):
        # 4 heads in 2 groups, one per TP rank; 50 rows padded to 64.
        self.run_case(hmf.Spec("llama", layers=4, groups=2, tied=False, seed=30), 2, 2)

    def test_llama_gqa_tp1_pp2_tied(self):
        # 8 heads in 2 groups (r = 4); the tied embedding's second instance is not written.
        self.run_case(hmf.Spec("llama", layers=4, hidden=32, heads=8, groups=2, tied=True,
                               seed=31), 1, 2)

    def test_gpt2_tp2_pp2_tied(self):
        # megatron_fixture's GPT-2 style model (LayerNorm and linear biases, learned positions,
        # GeLU, fused QKV [nh, 3, d]); expected: HF GPT-2's tensors from its logical parameters
        # (Conv1D weights are the transposes, c_attn the columns [q | k | v]).
        import megatron_fixture as mf
        model = mf.GPT(layers=4, hidden=16, heads=4, train_tp=2, seq=12, seed=32)
        folder = mf.write_deepspeed_pipe(self.p("ds"), model, 2, 2, args_overrides={
            "vocab_size": model.vocab, "layernorm_epsilon": 1e-5})
        out = self.p("out")
        self.export(folder, out)
        self.check_tensors(out, gpt2_expected(model))
        config = self.read_json(out, "config.json")
        self.assertEqual((config["model_type"], config["vocab_size"], config["n_positions"],
                          config["n_layer"], config["tie_word_embeddings"]),
                         ("gpt2", 50, 12, 4, True))
        self.assertEqual(self.inspect_json(folder)["hf_export"], {
            "family": "gpt2", "note": "exports to Hugging Face as gpt2 (--format hf)"})


class DeepSpeedQkvSubParamsTests(Base):
    """Megatron-DeepSpeed pipeline saves whose fused QKV each TP rank holds as [q_t; k_t; v_t]
    (universal_checkpoint_info's parameter_with_sub_params; hf_megatron_fixture's
    write_deepspeed_pipe(qkv_sub_params=True)), with and without ZeRO optimizer files.
    Consolidated, the QKV is [q; k; v], ds_to_universal's merge of the sub-params, from the
    layer files and (--include-optimizer) from the ZeRO files; exported with --format hf, q, k
    and v are the HF state dict's own. Both expectations are written here from the HF tensors."""

    def expected_pipe(self, spec, hf, tp):
        """The consolidated tensors under the pipe's names (`<layer spec index>.<key>`)."""
        def fused(p, kind):
            return np.concatenate([hf[p + "self_attn.%s_proj.%s" % (x, kind)] for x in "qkv"])
        out = {"1.word_embeddings.weight": np.concatenate([
            hf["model.embed_tokens.weight"], np.random.default_rng(spec.seed + 1).standard_normal(
                (spec.padded_vocab(tp) - spec.vocab, spec.hidden)).astype(np.float32)])}
        for i in range(spec.layers):
            p, n = "model.layers.%d." % i, "%d." % (3 + i)
            out[n + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
            out[n + "self_attention.query_key_value.weight"] = fused(p, "weight")
            if spec.family == "qwen2":
                out[n + "self_attention.query_key_value.bias"] = fused(p, "bias")
            out[n + "self_attention.dense.weight"] = hf[p + "self_attn.o_proj.weight"]
            out[n + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
            out[n + "mlp.dense_h_to_4h.weight"] = np.concatenate(
                [hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
            out[n + "mlp.dense_4h_to_h.weight"] = hf[p + "mlp.down_proj.weight"]
        out["%d.weight" % (spec.layers + 4)] = hf["model.norm.weight"]
        out["%d.lm_head.weight" % (spec.layers + 5)] = np.concatenate([
            hf["lm_head.weight"], np.random.default_rng(spec.seed + 2).standard_normal(
                (spec.padded_vocab(tp) - spec.vocab, spec.hidden)).astype(np.float32)])
        return out

    def run_case(self, spec, tp, pp, zero_dp):
        what = "%s TP%d x PP%d%s" % (spec.family, tp, pp, " ZeRO" if zero_dp else "")
        hf = hmf.hf_state_dict(spec)
        save = self.p(what.replace(" ", "-"))
        hmf.write_deepspeed_pipe(save, spec, hf, tp, pp, qkv_sub_params=True, zero_dp=zero_dp,
                                 vocab_size=spec.vocab)
        pipe = self.expected_pipe(spec, hf, tp)
        self.ok("consolidate", save, save + "-mg", "--no-progress")
        with self.subTest(what=what, output="consolidate"):
            self.check_tensors(save + "-mg", pipe)
        if zero_dp:
            # The ZeRO files' fp32 weights and Adam moments (the fixture's |0.5 x|, |0.25 x|).
            self.ok("consolidate", save, save + "-zero", "--no-progress", "--include-optimizer")
            with_moments = dict(pipe)
            for name, x in pipe.items():
                with_moments[name + ".exp_avg"] = np.abs(x * np.float32(0.5))
                with_moments[name + ".exp_avg_sq"] = np.abs(x * np.float32(0.25))
            with self.subTest(what=what, output="consolidate --include-optimizer"):
                self.check_tensors(save + "-zero", with_moments)
        self.export(save, save + "-hf")
        with self.subTest(what=what, output="--format hf"):
            self.check_tensors(save + "-hf", hf)
            self.check_config(save + "-hf", spec)

    def test_llama_gqa_tp1_and_tp2_with_and_without_zero_files(self):
        # 8 heads in 4 groups: q 32 rows, k and v 16 each, split over TP 2 on their own. With
        # as many groups as TP ranks [q_t; k_t; v_t] would be the per-group layout: more here.
        for tp, pp in ((1, 1), (2, 1), (2, 2)):
            for zero_dp in (None, 2):
                self.run_case(hmf.Spec("llama", layers=2, hidden=32, heads=8, groups=4,
                                       tied=False, seed=50), tp, pp, zero_dp)

    def test_qwen2_qkv_bias_tp2(self):
        # The bias is a sub-param tensor too: SubparamShape(((q, kv, kv),), 0).
        self.run_case(hmf.Spec("qwen2", layers=2, hidden=32, heads=8, groups=4, tied=False,
                               seed=51), 2, 1, None)


    def test_reshard_parts_hold_each_ranks_sub_params(self):
        # `reshard --parts N` into safetensors parts: each part's QKV (weight and bias) is its
        # slice of every sub-param, [q_t; k_t; v_t], as a Megatron-DeepSpeed TP rank saves it,
        # not rows t of [q; k; v]. From TP 2 and TP 1 saves (and the ZeRO files' reader), into
        # 1, 2 and 4 parts (4 query groups: each part keeps whole heads).
        spec = hmf.Spec("qwen2", layers=2, hidden=32, heads=8, groups=4, tied=False, seed=54)
        hf = hmf.hf_state_dict(spec)
        for tp, zero_dp in ((2, None), (1, None), (2, 2)):
            save = self.p("save-tp%d-zero%s" % (tp, zero_dp))
            hmf.write_deepspeed_pipe(save, spec, hf, tp, 1, qkv_sub_params=True,
                                     zero_dp=zero_dp, vocab_size=spec.vocab)
            for parts in (1, 2, 4):
                out = "%s-parts%d" % (save, parts)
                self.ok("reshard", save, out, "--parts", str(parts), "--no-progress")
                for t in range(parts):
                    got = st_tensors(os.path.join(out, "model_part-%d.safetensors" % t))
                    for i in range(spec.layers):
                        layer = "model.layers.%d.self_attn." % i
                        for kind in ("weight", "bias"):
                            name = "%d.self_attention.query_key_value.%s" % (3 + i, kind)
                            want = np.concatenate([
                                np.split(hf[layer + "%s_proj.%s" % (x, kind)], parts)[t]
                                for x in "qkv"])
                            with self.subTest(tp=tp, zero_dp=zero_dp, parts=parts, part=t,
                                              tensor=name):
                                self.assertTrue(torch.equal(got[name], torch.from_numpy(want)),
                                                "%s differs" % name)

    def test_gpt2_multi_head_tp2_pp2(self):
        # megatron_fixture's GPT-2 style model with query_key_value as sub-params (each rank
        # [q_t; k_t; v_t], not [heads, 3, d]): c_attn is the transpose of [q; k; v].
        import megatron_fixture as mf
        model = mf.GPT(layers=4, hidden=16, heads=4, train_tp=2, seq=12, seed=53,
                       qkv_sub_params=True)
        folder = mf.write_deepspeed_pipe(self.p("ds"), model, 2, 2, args_overrides={
            "vocab_size": model.vocab, "layernorm_epsilon": 1e-5})
        self.export(folder, self.p("out"))
        self.check_tensors(self.p("out"), gpt2_expected(model))

    def test_refusals(self):
        spec = hmf.Spec("llama", layers=2, hidden=32, heads=8, groups=4, tied=False, seed=52)
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_deepspeed_pipe(self.p("save"), spec, hf, 2, 1, qkv_sub_params=True,
                                          vocab_size=spec.vocab)
        qkv = '"3.self_attention.query_key_value.weight" (%s)' % os.path.join(
            folder, "layer_03-model_00-model_states.pt")
        # Megatron-LM / Megatron-Core outputs fuse QKV per query group: refused, no OUT.
        for fmt in ("megatron", "megatron-torch-dist"):
            out = self.p("out-" + fmt)
            res = self.ctl("reshard", folder, out, "--format", fmt, "--parts", "2",
                           "--no-progress")
            self.assertExit(res, 3)
            self.assertIn("tensor %s is a Megatron-DeepSpeed fused QKV saved as sub-params" % qkv,
                          res.text)
            self.assertIn("--format %s does not write it" % fmt, res.text)
            self.assertFalse(os.path.exists(out), out)
        # Sub-param sizes that are not q, k, v (k's and q's swapped): the export refuses.
        states = os.path.join(folder, "mp_rank_00_model_states.pt")
        saved = torch.load(states)
        q, kv = spec.heads * spec.head_dim, spec.groups * spec.head_dim
        for entry in saved["universal_checkpoint_info"]["parameter_with_sub_params"]:
            entry["shape"] = ((kv, q, kv),) + tuple(entry["shape"][1:])
        torch.save(saved, states)
        self.refused(folder, self.p("out-hf"), [],
                     "tensor %s is fused from sub-params of 16, 32, 16 along dimension 0 "
                     "(universal_checkpoint_info.parameter_with_sub_params), not q, k and v of "
                     "32, 16, 16 rows" % qkv)


class Gpt2Tests(Base):
    """GPT-2 (Megatron-LM legacy names, checkpoint_version 3): LayerNorm and linear biases,
    learned positions, fused QKV per head [nh, 3, d], and HF's Conv1D weights [in, out].

    The fixture starts from a known HF GPT-2 state dict, lays it out as Megatron does (numpy,
    below) and saves it with real torch; the expected output is that state dict cut to the
    true vocabulary, so the transposes and the QKV reordering are checked against formulas
    written here, not reshard's."""

    H, HEADS, LAYERS, POSITIONS, VOCAB = 16, 4, 2, 32, 50

    def hf_state_dict(self, seed):
        rng = np.random.default_rng(seed)
        h = self.H

        def r(*shape):
            return rng.standard_normal(shape).astype(np.float32)

        hf = {"transformer.wte.weight": r(self.VOCAB, h),
              "transformer.wpe.weight": r(self.POSITIONS, h)}
        for i in range(self.LAYERS):
            p = "transformer.h.%d." % i
            hf.update({p + "ln_1.weight": r(h), p + "ln_1.bias": r(h),
                       p + "attn.c_attn.weight": r(h, 3 * h), p + "attn.c_attn.bias": r(3 * h),
                       p + "attn.c_proj.weight": r(h, h), p + "attn.c_proj.bias": r(h),
                       p + "ln_2.weight": r(h), p + "ln_2.bias": r(h),
                       p + "mlp.c_fc.weight": r(h, 4 * h), p + "mlp.c_fc.bias": r(4 * h),
                       p + "mlp.c_proj.weight": r(4 * h, h), p + "mlp.c_proj.bias": r(h)})
        hf["transformer.ln_f.weight"] = r(h)
        hf["transformer.ln_f.bias"] = r(h)
        return hf

    def megatron_qkv(self, fused):
        """HF's [q; k; v] rows (c_attn.weight.T, or the bias) as Megatron's [nh, 3, d] rows."""
        d = self.H // self.HEADS
        rest = fused.shape[1:]
        return fused.reshape((3, self.HEADS, d) + rest).swapaxes(0, 1).reshape(fused.shape)

    def layer_tensors(self, hf, i):
        """Layer i's whole (TP 1) Megatron tensors of `hf`: suffix -> (array, TP split axis
        or None for replicated)."""
        p = "transformer.h.%d." % i
        return collections.OrderedDict([
            ("input_layernorm.weight", (hf[p + "ln_1.weight"], None)),
            ("input_layernorm.bias", (hf[p + "ln_1.bias"], None)),
            ("self_attention.query_key_value.weight",
             (self.megatron_qkv(hf[p + "attn.c_attn.weight"].T), 0)),
            ("self_attention.query_key_value.bias",
             (self.megatron_qkv(hf[p + "attn.c_attn.bias"]), 0)),
            ("self_attention.dense.weight", (hf[p + "attn.c_proj.weight"].T, 1)),
            ("self_attention.dense.bias", (hf[p + "attn.c_proj.bias"], None)),
            ("post_attention_layernorm.weight", (hf[p + "ln_2.weight"], None)),
            ("post_attention_layernorm.bias", (hf[p + "ln_2.bias"], None)),
            ("mlp.dense_h_to_4h.weight", (hf[p + "mlp.c_fc.weight"].T, 0)),
            ("mlp.dense_h_to_4h.bias", (hf[p + "mlp.c_fc.bias"], 0)),
            ("mlp.dense_4h_to_h.weight", (hf[p + "mlp.c_proj.weight"].T, 1)),
            ("mlp.dense_4h_to_h.bias", (hf[p + "mlp.c_proj.bias"], None)),
        ])

    def padded_words(self, hf, padded, seed):
        pad = np.random.default_rng(seed).standard_normal((padded - self.VOCAB, self.H))
        return np.concatenate([hf["transformer.wte.weight"], pad.astype(np.float32)])

    def args(self, tp, pp, padded, rank):
        h = self.H
        return argparse.Namespace(
            num_layers=self.LAYERS, hidden_size=h, ffn_hidden_size=4 * h,
            num_attention_heads=self.HEADS, max_position_embeddings=self.POSITIONS,
            seq_length=self.POSITIONS, padded_vocab_size=padded, make_vocab_size_divisible_by=8,
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=None, swiglu=False,
            untie_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute", normalization="LayerNorm",
            layernorm_epsilon=1e-5, add_bias_linear=True, openai_gelu=True,
            bias_gelu_fusion=False, params_dtype=torch.float32, fp16=False, bf16=False,
            rank=rank, world_size=tp * pp, data_parallel_size=1, iteration=100)

    def write(self, hf, tp, padded, seed, pp=1):
        """Megatron-LM TP x PP files of `hf`, the vocabulary padded to `padded` rows: layers
        split evenly over the stages and numbered locally, the embeddings in the first stage,
        the final norm (and, PP > 1, word_embeddings_for_head) in the last."""
        word = self.padded_words(hf, padded, seed)
        folder = self.p("save/iter_0000100")
        per = self.LAYERS // pp

        def whole(a):
            return torch.from_numpy(np.ascontiguousarray(a))

        for t in range(tp):
            def split(a, axis):
                return whole(a if axis is None else np.split(a, tp, axis=axis)[t])

            for stage in range(pp):
                first, last = stage == 0, stage == pp - 1
                enc = collections.OrderedDict()
                for local, i in enumerate(range(stage * per, (stage + 1) * per)):
                    for suffix, (array, axis) in self.layer_tensors(hf, i).items():
                        enc["layers.%d.%s" % (local, suffix)] = split(array, axis)
                if last:
                    enc["final_layernorm.weight"] = whole(hf["transformer.ln_f.weight"])
                    enc["final_layernorm.bias"] = whole(hf["transformer.ln_f.bias"])
                lm = collections.OrderedDict()
                if first:
                    lm["embedding"] = {
                        "word_embeddings": {"weight": split(word, 0)},
                        "position_embeddings": {"weight": whole(hf["transformer.wpe.weight"])}}
                lm["encoder"] = enc
                model = collections.OrderedDict(language_model=lm)
                if last and not first:
                    model["word_embeddings_for_head"] = {"weight": split(word, 0)}
                ckpt = collections.OrderedDict(
                    args=self.args(tp, pp, padded, stage * tp + t), checkpoint_version=3.0,
                    iteration=100, model=model)
                name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, stage)
                os.makedirs(os.path.join(folder, name))
                torch.save(ckpt, os.path.join(folder, name, "model_optim_rng.pt"))
        with open(self.p("save/latest_checkpointed_iteration.txt"), "w") as f:
            f.write("100")
        return folder

    def write_torch_dist(self, hf, tp, pp, padded, seed):
        """The Megatron-Core torch_dist checkpoint of `hf` at TP x PP (tied embeddings, TE
        names, layers stacked under decoder.layers.<rest>, the args in common.pt)."""
        import dcp_fixture as F  # noqa: E402 -- the DCP writer of the torch_dist fixtures

        folder = self.p("save/iter_0000100")
        per = self.LAYERS // pp
        last = tp * (pp - 1)
        state, shards = collections.OrderedDict(), {}

        def add(key, array, grid):
            state[key] = torch.from_numpy(np.ascontiguousarray(array)).clone()
            shards[key] = grid

        add("embedding.word_embeddings.weight", self.padded_words(hf, padded, seed),
            F.Grid({0: tp}, lambda i: i[0]))
        add("embedding.position_embeddings.weight", hf["transformer.wpe.weight"],
            F.Grid({}, lambda i: 0))
        layers = [self.layer_tensors(hf, i) for i in range(self.LAYERS)]
        for suffix, te in hmf.LEGACY_TO_CORE.items():
            axis = layers[0][suffix][1]
            grid = (F.Grid({0: self.LAYERS}, lambda i: tp * (i[0] // per)) if axis is None else
                    F.Grid({0: self.LAYERS, axis + 1: tp},
                           lambda i, d=axis + 1: i[d] + tp * (i[0] // per)))
            add("decoder.layers." + te, np.stack([layer[suffix][0] for layer in layers]), grid)
        add("decoder.final_layernorm.weight", hf["transformer.ln_f.weight"],
            F.Grid({}, lambda i: last))
        add("decoder.final_layernorm.bias", hf["transformer.ln_f.bias"],
            F.Grid({}, lambda i: last))
        F.write_dcp(folder, state, tp * pp, shards, modules="new", planner_data=False,
                    dedup="lowest")
        torch.save({"args": self.args(tp, pp, padded, 0), "iteration": 100,
                    "checkpoint_version": 3.0}, os.path.join(folder, "common.pt"))
        with open(self.p("save/latest_checkpointed_iteration.txt"), "w") as f:
            f.write("100")
        with open(os.path.join(folder, "metadata.json"), "w") as f:
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
        return folder

    def run_case(self, tp, padded, seed, pp=1, torch_dist=False):
        hf = self.hf_state_dict(seed)
        if torch_dist:
            folder = self.write_torch_dist(hf, tp, pp, padded, seed + 1)
        else:
            folder = self.write(hf, tp, padded, seed + 1, pp)
        out = self.p("out")
        self.export(folder, out, "--vocab-size", str(self.VOCAB))
        self.check_tensors(out, hf)
        # GPT2Config's keys and JSON types (transformers' documentation), and the values
        # convert_megatron_gpt2_checkpoint.py gives them.
        config = self.read_json(out, "config.json")
        self.assertEqual(config, {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": self.VOCAB,
            "n_positions": self.POSITIONS, "n_embd": self.H, "n_layer": self.LAYERS,
            "n_head": self.HEADS, "n_inner": None, "activation_function": "gelu_new",
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True,
            "torch_dtype": "float32", "use_cache": True})
        for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            self.assertIs(type(config[key]), int, key)
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon",
                    "initializer_range"):
            self.assertIs(type(config[key]), float, key)
        doc = self.inspect_json(folder)
        description = doc.get("result", doc)["description"]
        self.assertTrue(description.endswith(
            "; --format hf --family auto: gpt2 (LayerNorm biases or learned position "
            "embeddings)"), description)

    def test_gpt2_tp1_padded_vocab(self):
        self.run_case(1, 56, 11)

    def test_gpt2_tp2_padded_vocab(self):
        self.run_case(2, 64, 12)

    def test_gpt2_tp2_pp2_padded_vocab(self):
        # Stage-local layer numbers; the last stage's word_embeddings_for_head is not written.
        self.run_case(2, 64, 15, pp=2)

    def test_gpt2_torch_dist_tp2_pp2(self):
        self.run_case(2, 64, 16, pp=2, torch_dist=True)

    def test_gpt2_tensors_refused_by_a_llama_style_family(self):
        folder = self.write(self.hf_state_dict(13), 1, 56, 14)
        self.refused(folder, self.p("out"), ["--family", "llama", "--vocab-size", "50"],
                     "tensor \"language_model.embedding.position_embeddings.weight\" is a "
                     "LayerNorm or linear bias or a learned position embedding, which family llama "
                     "has no place for (gpt2 has: --family gpt2)")


# A tokenizer as tokenizers / transformers save it: the special tokens in added_tokens and in
# the BPE vocabulary; <|begin|> is id 47 and <|end|> id 48 of the 50-token model.
TOKENIZER_JSON = json.dumps({
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 47, "content": "<|begin|>", "special": True},
                     {"id": 48, "content": "<|end|>", "special": True}],
    "normalizer": None,
    "model": {"type": "BPE", "vocab": dict([("t%d" % i, i) for i in range(47)]
                                           + [("<|begin|>", 47), ("<|end|>", 48), ("<unk>", 49)]),
              "merges": ["t1 t2"]},
}, indent=2)
TOKENIZER_CONFIG = json.dumps({"bos_token": "<|begin|>",
                               "eos_token": {"content": "<|end|>", "lstrip": False},
                               "chat_template": "{{ messages }}"})


class TokenizerTests(Base):
    """Tokenizer files beside a Megatron checkpoint: in its save folder or a tokenizer/
    subfolder, carried into the hf output with the special token ids they give."""

    def save(self, tp=2, pp=1):
        spec = hmf.Spec("llama", groups=2, seed=11)
        hf = hmf.hf_state_dict(spec)
        folder = hmf.write_megatron_lm(self.p("save"), spec, hf, tp, pp, vocab_size=50)
        return folder, spec, hf

    def write_tokenizer(self, folder, special_tokens_map=None):
        os.makedirs(folder, exist_ok=True)
        files = {"tokenizer.json": TOKENIZER_JSON, "tokenizer_config.json": TOKENIZER_CONFIG,
                 "merges.txt": "#version: 0.2\nt1 t2\n"}
        if special_tokens_map is not None:
            files["special_tokens_map.json"] = json.dumps(special_tokens_map)
        for name, text in files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        return files

    def assert_carried(self, out, files):
        for name, text in files.items():
            with open(os.path.join(out, name)) as f:
                self.assertEqual(f.read(), text, name)

    def test_tokenizer_in_the_save_folder_with_its_token_ids(self):
        folder, spec, hf = self.save()
        files = self.write_tokenizer(self.p("save"), {"bos_token": "<|begin|>",
                                                      "eos_token": "<|end|>"})
        out = self.p("out")
        self.export(self.p("save"), out)
        self.check_tensors(out, hf)
        self.assert_carried(out, files)
        config = self.read_json(out, "config.json")
        self.assertEqual((config["bos_token_id"], config["eos_token_id"]), (47, 48))
        self.assertEqual(self.read_json(out, "generation_config.json"),
                         {"_from_model_config": True, "bos_token_id": 47, "eos_token_id": 48})

    def test_tokenizer_subfolder_found_from_the_iteration_folder(self):
        # special_tokens_map.json names another eos token: eos_token_id is left out.
        folder, spec, hf = self.save(2, 2)
        files = self.write_tokenizer(self.p("save", "tokenizer"), {"eos_token": "<unk>"})
        out = self.p("out")
        self.export(folder, out)
        self.assert_carried(out, files)
        config = self.read_json(out, "config.json")
        self.assertEqual(config["bos_token_id"], 47)
        self.assertNotIn("eos_token_id", config)
        self.assertEqual(self.read_json(out, "generation_config.json"),
                         {"_from_model_config": True, "bos_token_id": 47})

    def test_tokenizer_flag_overrides_and_no_extra_files_leaves_out(self):
        folder, spec, hf = self.save()
        self.write_tokenizer(self.p("save"))
        other = self.p("other")
        os.makedirs(other)
        with open(os.path.join(other, "tokenizer.model"), "wb") as f:
            f.write(nemo_fixture.sentencepiece_blob(20, bos=3, eos=4))
        out = self.p("out")
        self.export(self.p("save"), out, "--tokenizer", other)
        self.assertEqual(sorted(n for n in os.listdir(out) if not n.startswith("model")),
                         ["config.json", "generation_config.json", "reshard-manifest.json",
                          "tokenizer.model"])
        # The ids are the replacing tokenizer.model's, not the save's tokenizer.json's (47, 48).
        config = self.read_json(out, "config.json")
        self.assertEqual((config["bos_token_id"], config["eos_token_id"]), (3, 4))
        out2 = self.p("out2")
        self.export(self.p("save"), out2, "--no-extra-files")
        self.assertEqual(sorted(n for n in os.listdir(out2) if not n.startswith("model")),
                         ["config.json", "generation_config.json", "reshard-manifest.json"])

    def test_tokenizer_symlink_leaving_the_checkpoint_is_refused(self):
        folder, spec, hf = self.save()
        self.write_tokenizer(self.p("outside"))
        os.makedirs(self.p("save", "tokenizer"))
        link = self.p("save", "tokenizer", "tokenizer.json")
        os.symlink(self.p("outside", "tokenizer.json"), link)
        self.refused(self.p("save"), self.p("out"), [],
                     "%s is a symlink to %s, outside the folder %s" % (
                         link, self.p("outside", "tokenizer.json"),
                         os.path.realpath(self.p("save"))))


class RefusalTests(Base):
    def checkpoint(self, spec=None, tp=2, pp=1, **arg_overrides):
        spec = spec or hmf.Spec("llama", groups=2)
        hf = hmf.hf_state_dict(spec)
        return hmf.write_megatron_lm(self.p("save"), spec, hf, tp, pp, **arg_overrides)

    def test_unknown_family_lists_the_families_and_flags(self):
        self.refused(self.checkpoint(), self.p("out"), ["--family", "falcon", "--vocab-size", "50"],
                     "unknown model family \"falcon\" for --format hf; the families are llama, "
                     "mistral, qwen2, qwen3, gpt2, mixtral (--family F picks one, --family auto "
                     "decides from the checkpoint; --config FILE overrides what the args say)")

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


# Every output format and family there is, listed here independently of the registries.
OUTPUT_FORMATS = ("safetensors", "torch", "olmo-safetensors", "deepspeed-universal", "torch-dcp",
                  "megatron", "megatron-torch-dist", "hf")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral")
ONLY_HF = ("is only for --format hf (a Hugging Face model written from a Megatron checkpoint)")
ONLY_HF_OR_IMPORT = (ONLY_HF + " and for a Hugging Face model imported with --format megatron or "
                     "megatron-torch-dist; ")


class FlagTests(Base):
    """--family, --config and --vocab-size are refused by the jobs that would ignore them, and
    reshardctl's help says what its flags do."""

    def test_hf_flags_refused_by_jobs_that_ignore_them(self):
        spec = hmf.Spec("llama", groups=2)
        folder = hmf.write_megatron_lm(self.p("save"), spec, hmf.hf_state_dict(spec), 2, 1)
        config = self.p("config.json")
        with open(config, "w") as f:
            json.dump({"rope_theta": 10000.0}, f)
        cases = [
            (["consolidate", folder, self.p("o1"), "--family", "llama"],
             "--family " + ONLY_HF_OR_IMPORT + "not for output format safetensors"),
            (["consolidate", folder, self.p("o2"), "--format", "torch", "--config", config],
             "--config " + ONLY_HF_OR_IMPORT + "not for output format torch"),
            (["reshard", folder, self.p("o3"), "--parts", "1", "--format", "megatron",
              "--vocab-size", "50"],
             "--vocab-size " + ONLY_HF + "; not for output format megatron"),
            # The Megatron outputs read them only from a Hugging Face model they import.
            (["reshard", folder, self.p("o4"), "--parts", "2", "--format", "megatron",
              "--family", "llama"],
             "%s: --family %sthe input is megatron, not a Hugging Face model folder"
             % (folder, ONLY_HF_OR_IMPORT)),
            (["consolidate", folder, self.p("o5"), "--format", "megatron-torch-dist",
              "--config", config],
             "%s: --config %sthe input is megatron, not a Hugging Face model folder"
             % (folder, ONLY_HF_OR_IMPORT)),
        ]
        for args, message in cases:
            with self.subTest(args=args[3:]):
                res = self.ctl(*args, "--no-progress", "--json")
                self.assertExit(res, 2)
                doc = json.loads(res.stdout_text)
                self.assertEqual(doc["error"]["code"], "INVALID_ARGUMENT")
                self.assertEqual(doc["error"]["message"], message)
                self.assertFalse(os.path.exists(args[2]), "%s written" % args[2])
        # --tokenizer is read by any output that is a Hugging Face model.
        tok = self.p("tok")
        os.makedirs(tok)
        with open(os.path.join(tok, "tokenizer.json"), "w") as f:
            f.write("{}")
        self.ok("consolidate", folder, self.p("o6"), "--tokenizer", tok, "--no-progress")
        self.assertTrue(os.path.exists(self.p("o6", "tokenizer.json")))

    def test_pipeline_and_expert_parts_refused_by_outputs_without_them(self):
        spec = hmf.Spec("llama", groups=2)
        folder = hmf.write_megatron_lm(self.p("save"), spec, hmf.hf_state_dict(spec), 2, 1)
        for fmt, named in ((None, "safetensors"), ("torch", "torch"), ("torch-dcp", "torch-dcp"),
                           ("hf", "hf")):
            out = self.p("out-%s" % named)
            args = ["reshard", folder, out, "--parts", "1", "--pipeline-parts", "2"]
            if fmt is not None:
                args += ["--format", fmt]
            with self.subTest(output=named):
                res = self.ctl(*args, "--no-progress", "--json")
                self.assertExit(res, 2)
                doc = json.loads(res.stdout_text)
                self.assertEqual(doc["error"]["code"], "INVALID_ARGUMENT")
                self.assertEqual(doc["error"]["message"],
                                 "--pipeline-parts is only for --format megatron and "
                                 "megatron-torch-dist (the outputs with pipeline stages); not for "
                                 "output format %s" % named)
                self.assertFalse(os.path.exists(out), "%s written" % out)
            # --expert-parts likewise: only the Megatron outputs have expert-parallel ranks.
            out = self.p("out-ep-%s" % named)
            args = ["reshard", folder, out, "--parts", "1", "--expert-parts", "2"]
            if fmt is not None:
                args += ["--format", fmt]
            with self.subTest(output=named, flag="--expert-parts"):
                res = self.ctl(*args, "--no-progress", "--json")
                self.assertExit(res, 2)
                doc = json.loads(res.stdout_text)
                self.assertEqual(doc["error"]["code"], "INVALID_ARGUMENT")
                self.assertEqual(doc["error"]["message"],
                                 "--expert-parts is only for output formats megatron and "
                                 "megatron-torch-dist, not %s" % named)
                self.assertFalse(os.path.exists(out), "%s written" % out)
        # The Megatron outputs take it.
        self.ok("reshard", folder, self.p("mg"), "--parts", "1", "--pipeline-parts", "2",
                "--format", "megatron", "--no-progress")
        self.assertEqual(sorted(os.listdir(self.p("mg", "iter_0000100"))),
                         ["mp_rank_00_000", "mp_rank_00_001"])

    def help_text(self, command):
        """`reshardctl COMMAND --help`, with CLI11's line wrapping undone."""
        res = self.ctl(command, "--help")
        self.assertExit(res, 0)
        return " ".join(res.stdout_text.split())

    def test_help_says_what_the_hf_and_megatron_flags_do(self):
        for command in ("consolidate", "reshard"):
            text = self.help_text(command)
            listed = text.split("output format: ", 1)[1].split(" --", 1)[0].split(" | ")
            self.assertEqual(sorted(listed), sorted(OUTPUT_FORMATS), command)
            self.assertIn("model family, auto | " + " | ".join(FAMILIES) + ": --format hf: the "
                          "family written (auto: from the args and tensor names); a Hugging Face "
                          "input written as megatron or megatron-torch-dist: the family its "
                          "weights are read as (auto: config.json's model_type, else "
                          "architectures); refused for other jobs", text, command)
            self.assertIn("JSON file FILE: --format hf: keys overriding or completing the "
                          "config.json made from the checkpoint's args; a Hugging Face input "
                          "written as megatron or megatron-torch-dist: the config.json read in "
                          "place of the input folder's; refused for other jobs", text, command)
            self.assertIn("--format hf only: the true vocabulary N (the tokenizer's size; "
                          "default: the args'); padded rows past it are dropped", text, command)
        text = self.help_text("reshard")
        self.assertIn("pipeline stages PP (default 1; must divide the layers): --format megatron "
                      "writes TP x PP rank folders, from Megatron input (Megatron-LM, "
                      "Megatron-DeepSpeed, torch_dist) or a Hugging Face model imported; "
                      "--format megatron-torch-dist records PP in its args (it loads at any TP x "
                      "PP)", text)
        self.assertIn("expert-parallel ranks EP of a mixture-of-experts model (--format megatron: "
                      "rank folders mp_rank_TT[_PPP]_EEE; megatron-torch-dist: the files of EP "
                      "rank e's ranks hold its experts; default 1; must divide the experts)", text)
        # The help of reshardctl itself lists what it writes.
        res = self.ctl("--help")
        self.assertExit(res, 0)
        listed = res.stdout_text.split("writes: ", 1)[1].split("\n", 1)[0].split(", ")
        self.assertEqual(sorted(listed), sorted(OUTPUT_FORMATS))


class InspectHfExportTests(Base):
    """inspect of a Megatron checkpoint says what `--format hf` writes it as, or why not."""

    def check(self, folder, family, note):
        doc = self.inspect_json(folder)
        self.assertEqual(doc["hf_export"], {"family": family, "note": note})
        res = self.ok("inspect", folder)
        self.assertIn("\nhf:       %s\n" % note, res.stdout_text)

    def test_legacy_and_torch_dist_llama(self):
        spec = hmf.Spec("llama", groups=2)
        hf = hmf.hf_state_dict(spec)
        note = "exports to Hugging Face as llama (--format hf)"
        self.check(hmf.write_megatron_lm(self.p("lm"), spec, hf, 2, 2, vocab_size=50), "llama",
                   note)
        self.check(hmf.write_torch_dist(self.p("td"), spec, hf, 2, 1, vocab_size=50), "llama",
                   note)

    def test_megatron_deepspeed_pipeline(self):
        # Megatron-DeepSpeed's pipeline layer names ("<layer>.<rest>") are read as Megatron-LM's.
        spec = hmf.Spec("llama", groups=2)
        folder = hmf.write_deepspeed_pipe(self.p("ds"), spec, hmf.hf_state_dict(spec), 2, 2,
                                          vocab_size=50)
        self.check(folder, "llama", "exports to Hugging Face as llama (--format hf)")

    def test_why_not(self):
        spec = hmf.Spec("qwen2", groups=2)
        folder = hmf.write_megatron_lm(self.p("lm"), spec, hmf.hf_state_dict(spec), 1, 1,
                                       rotary_base=None)
        self.check(folder, None,
                   "does not export to Hugging Face as qwen2 (--format hf) as it stands: "
                   "config.json "
                   "needs rope_theta (from args.rotary_base), vocab_size (from --vocab-size or "
                   "args.vocab_size), which the checkpoint's args do not record; give them in "
                   "--config FILE (a JSON object of config.json keys) or give the true "
                   "vocabulary with --vocab-size N")
        # Not a Megatron checkpoint: nothing to say.
        self.assertIsNone(self.inspect_json(os.path.join(folder, "mp_rank_00",
                                                         "model_optim_rng.pt"))["hf_export"])
        res = self.ok("inspect", os.path.join(folder, "mp_rank_00", "model_optim_rng.pt"))
        self.assertNotIn("\nhf:", res.stdout_text)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
