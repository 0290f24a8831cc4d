"""End-to-end tests of the Mixtral family of `--format hf` (lib/formats/hf): Megatron-Core
mixture-of-experts checkpoints saved in the legacy mp_rank_TT[_PPP]_EEE folders (8 experts over
EP 2 and EP 4, TP 2, SequentialMLP and TEGroupedMLP names), written with real torch by
tests/fixtures/megatron_moe_fixture.py, exported to a Hugging Face Mixtral folder, and a
Hugging Face Mixtral folder imported into Megatron (`reshard --format megatron --parts TP
[--expert-parts EP]`: Megatron-Core's names, which are what Megatron-LM loads for
mixture-of-experts models), read back by reshard's megatron reader and exported back.

Run:  /usr/bin/python3 tests/hf_mixtral_e2e_test.py --reshardctl PATH [unittest args]

The expected HF tensors are computed here in numpy from the fixture's logical model (the
formulas of transformers' Mixtral names: q/k/v from the fused QKV viewed [ng, r + 2, d, h],
expert e's w1 = gate, w3 = up, w2 = down, the router as block_sparse_moe.gate), never by
reshard, and compared element by element (torch.equal) with what the independent safetensors
reader (st_reference.py through st_torch.py) reads. config.json is checked key by key against
the names and JSON types of transformers' MixtralConfig as its documentation gives them: no
transformers package is installed here, so the config is not loaded by transformers itself.
"""

import collections
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import harness  # noqa: E402
import hf_export_e2e_test as HE  # noqa: E402
import hf_import_e2e_test as HI  # noqa: E402
import megatron_moe_fixture as moe  # noqa: E402
from st_torch import write_file  # noqa: E402

VOCAB = 18  # the true vocabulary: the fixture pads it to 24 rows for TP 2
ROPE_THETA = 1000000
AUX_LOSS = 0.02

# MixtralConfig's keys (transformers' documentation) that the export writes, with their JSON
# types; rope_scaling is the common rope key of the decoder configs.
MIXTRAL_KEYS = {
    "architectures": list, "model_type": str, "hidden_size": int, "intermediate_size": int,
    "num_hidden_layers": int, "num_attention_heads": int, "num_key_value_heads": int,
    "head_dim": int, "hidden_act": str, "max_position_embeddings": int, "rms_norm_eps": float,
    "rope_theta": float, "rope_scaling": type(None), "vocab_size": int,
    "tie_word_embeddings": bool, "sliding_window": type(None), "num_local_experts": int,
    "num_experts_per_tok": int, "router_aux_loss_coef": float, "torch_dtype": str,
    "use_cache": bool,
}


def mixtral_args():
    """The args a Megatron Mixtral run records beyond the fixture's."""
    return {"vocab_size": VOCAB, "rotary_base": ROPE_THETA, "norm_epsilon": 1e-5,
            "moe_aux_loss_coeff": AUX_LOSS, "moe_shared_expert_intermediate_size": None}


def hf_reference(model):
    """The HF Mixtral state dict of the fixture's logical model, in numpy."""
    h, d, ng = model.hidden, model.hn, model.groups
    r = model.heads // ng
    out = collections.OrderedDict()
    out["model.embed_tokens.weight"] = model.embed[:VOCAB]
    for i, lay in enumerate(model.layer):
        p = "model.layers.%d." % i
        qkv = lay["qkv"].reshape(ng, r + 2, d, h)
        out[p + "input_layernorm.weight"] = lay["qkv_norm"]
        out[p + "self_attn.q_proj.weight"] = qkv[:, :r].reshape(ng * r * d, h)
        out[p + "self_attn.k_proj.weight"] = qkv[:, r].reshape(ng * d, h)
        out[p + "self_attn.v_proj.weight"] = qkv[:, r + 1].reshape(ng * d, h)
        out[p + "self_attn.o_proj.weight"] = lay["proj"]
        out[p + "post_attention_layernorm.weight"] = lay["mlp_norm"]
        out[p + "block_sparse_moe.gate.weight"] = lay["router"]
        for e in range(model.experts):
            q = p + "block_sparse_moe.experts.%d." % e
            out[q + "w1.weight"] = lay["gate"][e]
            out[q + "w2.weight"] = lay["down"][e]
            out[q + "w3.weight"] = lay["up"][e]
    out["model.norm.weight"] = model.final_norm
    out["lm_head.weight"] = model.output[:VOCAB]
    return out


def mixtral_config(model):
    """config.json as the export must write it for the fixture's model."""
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": model.hidden, "intermediate_size": model.moe_ffn,
        "num_hidden_layers": model.layers, "num_attention_heads": model.heads,
        "num_key_value_heads": model.groups, "head_dim": model.hn, "hidden_act": "silu",
        "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": float(ROPE_THETA),
        "rope_scaling": None, "vocab_size": VOCAB, "tie_word_embeddings": False,
        "sliding_window": None, "num_local_experts": model.experts,
        "num_experts_per_tok": model.topk, "router_aux_loss_coef": AUX_LOSS,
        "torch_dtype": "float32", "use_cache": True,
    }


# Layer 0 of the Megatron-Core GPTModel Megatron-LM builds for a Mixtral run (local layer spec,
# get_gpt_layer_local_spec(num_experts, moe_grouped_gemm=False)), written out from its module
# tree: TransformerLayer.input_layernorm, self_attention (SelfAttention: linear_qkv,
# linear_proj), pre_mlp_layernorm, mlp (MoELayer: router = TopKRouter, weight [E, h], no bias;
# experts = SequentialMLP: local_experts.<l> = MLP with linear_fc1, linear_fc2, no biases).
LAYER0_DENSE = [
    "decoder.layers.0.input_layernorm.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.pre_mlp_layernorm.weight",
    "decoder.layers.0.mlp.router.weight",
]
LAYER0_EXPERT = [
    "decoder.layers.0.mlp.experts.local_experts.%d.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.%d.linear_fc2.weight",
]


def megatron_rank(model, t, tp, e=0, ep=1):
    """The state dict of TP rank t, EP rank e of the checkpoint the import writes (PP 1): the
    flat dict Megatron-Core's GPTModel saves (--ckpt-format torch), the vocabulary padded with
    zero rows to a multiple of 128 x TP, [gate_t; up_t] per expert, experts g in
    [e * E_local, (e + 1) * E_local) as local experts g - e * E_local, the router replicated."""
    padded = (VOCAB + 128 * tp - 1) // (128 * tp) * (128 * tp)
    local = model.experts // ep

    def vocab_rows(table):
        full = np.zeros((padded, model.hidden), np.float32)
        full[:VOCAB] = table[:VOCAB]
        return moe._rows(full, t, tp)
    out = collections.OrderedDict()
    out["embedding.word_embeddings.weight"] = vocab_rows(model.embed)
    for i, lay in enumerate(model.layer):
        p = "decoder.layers.%d." % i
        out[p + "input_layernorm.weight"] = lay["qkv_norm"]
        out[p + "self_attention.linear_qkv.weight"] = moe._rows(lay["qkv"], t, tp)
        out[p + "self_attention.linear_proj.weight"] = moe._cols(lay["proj"], t, tp)
        out[p + "pre_mlp_layernorm.weight"] = lay["mlp_norm"]
        out[p + "mlp.router.weight"] = lay["router"]
        for lo in range(local):
            g = e * local + lo
            q = p + "mlp.experts.local_experts.%d." % lo
            out[q + "linear_fc1.weight"] = np.concatenate(
                [moe._rows(lay["gate"][g], t, tp), moe._rows(lay["up"][g], t, tp)])
            out[q + "linear_fc2.weight"] = moe._cols(lay["down"][g], t, tp)
    out["decoder.final_layernorm.weight"] = model.final_norm
    out["output_layer.weight"] = vocab_rows(model.output)
    return out


def consolidated_megatron(model):
    """The merged model reshard's megatron reader makes of the import's output: Megatron-Core
    names, every expert under its global id, TP joined ([gate; up] per expert), the vocabulary
    as the padded rows of TP 1 (the reader keeps what the files hold: trimmed by the caller)."""
    out = collections.OrderedDict()
    for i, lay in enumerate(model.layer):
        p = "decoder.layers.%d." % i
        out[p + "mlp.router.weight"] = lay["router"]
        for g in range(model.experts):
            q = p + "mlp.experts.local_experts.%d." % g
            out[q + "linear_fc1.weight"] = np.concatenate([lay["gate"][g], lay["up"][g]])
            out[q + "linear_fc2.weight"] = lay["down"][g]
    return out


class Base(HE.Base):
    """HE.Base's export, refused, read_output and check_tensors, on Mixtral checkpoints."""
    TMP_PREFIX = "reshard-mixtral"

    def save(self, model, tp=2, pp=1, ep=2, grouped=False):
        moe.write(self.p("save"), model, tp=tp, pp=pp, ep=ep, grouped=grouped,
                  arg_overrides=mixtral_args())
        return self.p("save")

    def check_mixtral_config(self, out, model):
        config = self.read_json(out, "config.json")
        self.assertEqual(sorted(config), sorted(MIXTRAL_KEYS), "config.json keys")
        for key, kind in MIXTRAL_KEYS.items():
            self.assertIsInstance(config[key], kind, key)
        self.assertEqual(config, mixtral_config(model))


class MixtralExportTests(Base):
    def run_case(self, grouped, pp=1, seed=3, ep=2):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=seed)
        src = self.save(model, pp=pp, ep=ep, grouped=grouped)
        out = self.p("hf")
        self.export(src, out, "--max-shard-size", "4KB")
        self.check_tensors(out, hf_reference(model))
        self.check_mixtral_config(out, model)
        return src

    def test_ep2_tp2_sequential_experts(self):
        src = self.run_case(grouped=False)
        res = self.ctl("inspect", src)
        self.assertExit(res, 0)
        self.assertIn("--format hf --family auto: mixtral (mixture-of-experts layers)", res.text)

    def test_ep2_tp2_grouped_gemm_experts(self):
        self.run_case(grouped=True, seed=4)

    def test_ep2_tp2_pp2_grouped_gemm_experts(self):
        self.run_case(grouped=True, pp=2, seed=5)

    def test_ep4_tp2_sequential_experts(self):
        # 8 experts, 2 on each of 4 EP ranks: local experts 0, 1 of rank e are global 2e, 2e + 1.
        self.run_case(grouped=False, seed=12, ep=4)

    def test_ep4_tp2_pp2_grouped_gemm_experts(self):
        self.run_case(grouped=True, pp=2, seed=13, ep=4)


class MixtralRefusalTests(Base):
    def test_shared_experts_are_refused(self):
        model = moe.MoE(train_tp=2, seed=6)  # with shared experts (Qwen-MoE, DeepSeek-MoE)
        src = self.save(model)
        self.refused(src, self.p("out"), [],
                     '"decoder.layers.0.mlp.shared_experts.linear_fc1.weight" is part of the '
                     'shared experts, which Mixtral')

    def test_dense_family_refuses_experts(self):
        src = self.save(moe.MoE(shared_ffn=0, train_tp=2, seed=7))
        self.refused(src, self.p("out"), ["--family", "llama"],
                     "which family llama has no place for (mixtral has: --family mixtral)")


class VocabPaddingTests(Base):
    """A Megatron-Core checkpoint whose vocabulary rows disagree with args.padded_vocab_size is
    refused by the megatron reader, naming the tensor it checked, its file and both sizes."""

    def check_refused(self, src, message):
        for fmt in ("hf", "megatron"):
            out = self.p("out-" + fmt)
            res = self.ctl("consolidate", src, out, "--format", fmt, "--no-progress")
            self.assertExit(res, 3)
            self.assertIn(message, res.text, self.describe(res))
            self.assertFalse(os.path.exists(out))

    def test_padded_vocab_size_other_than_the_embedding_rows(self):
        src = self.p("save")
        moe.write(src, moe.MoE(shared_ffn=0, train_tp=2, seed=11), tp=2, pp=1, ep=2,
                  arg_overrides=dict(mixtral_args(), padded_vocab_size=32))
        self.check_refused(
            src, 'tensor "embedding.word_embeddings.weight" of %s/iter_0000100/mp_rank_00_000/'
            'model_optim_rng.pt has 12 rows, 24 over TP 2, but args.padded_vocab_size is 32'
            % src)

    def test_output_layer_padded_otherwise_than_the_embedding(self):
        src = self.save(moe.MoE(shared_ffn=0, train_tp=2, seed=12))
        folder = os.path.join(src, "iter_0000100")
        for rank in os.listdir(folder):
            path = os.path.join(folder, rank, "model_optim_rng.pt")
            ckpt = torch.load(path)
            ckpt["model"]["output_layer.weight"] = ckpt["model"]["output_layer.weight"][:8].clone()
            torch.save(ckpt, path)
        self.check_refused(
            src, 'tensor "output_layer.weight" of %s/iter_0000100/mp_rank_00_000/'
            'model_optim_rng.pt has 8 rows, 16 over TP 2, but args.padded_vocab_size is 24'
            % src)


class MixtralImportTests(Base):
    def hf_folder(self, model):
        """save_pretrained's layout of the reference state dict: two shards, index, config."""
        folder = self.p("hf-in")
        os.makedirs(folder)
        hf = hf_reference(model)
        names = list(hf)
        half = len(names) // 2
        weight_map = {}
        for i, part in enumerate([names[:half], names[half:]]):
            file = "model-%05d-of-00002.safetensors" % (i + 1)
            write_file(os.path.join(folder, file), collections.OrderedDict(
                (n, torch.from_numpy(np.ascontiguousarray(hf[n]))) for n in part))
            weight_map.update({n: file for n in part})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(mixtral_config(model), f)
        return folder, hf

    def import_and_check(self, model, tp, ep):
        """Imports the HF folder of `model` at TP x EP (PP 1), checks every rank file's names,
        tensors and args against Megatron-Core's, and returns the output folder and the HF
        reference."""
        folder, hf = self.hf_folder(model)
        mg = self.p("megatron")
        flags = ["--expert-parts", ep] if ep > 1 else []
        self.assertExit(self.ctl("reshard", folder, mg, "--format", "megatron", "--parts", tp,
                                 *flags, "--no-progress"), 0)
        local = model.experts // ep
        ranks = [(t, e) for t in range(tp) for e in range(ep)]
        dirs = ["mp_rank_%02d_%03d" % (t, e) if ep > 1 else "mp_rank_%02d" % t
                for t, e in ranks]
        self.assertEqual(sorted(os.listdir(os.path.join(mg, "release"))), sorted(dirs))
        for (t, e), name in zip(ranks, dirs):
            ckpt = torch.load(os.path.join(mg, "release", name, "model_optim_rng.pt"))
            args = ckpt["args"]
            self.assertEqual(
                (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size,
                 args.moe_aux_loss_coeff, args.moe_router_load_balancing_type,
                 args.moe_router_pre_softmax, args.moe_grouped_gemm,
                 args.expert_model_parallel_size, args.expert_tensor_parallel_size,
                 args.tensor_model_parallel_size, args.use_legacy_models, args.transformer_impl,
                 args.ckpt_format),
                (model.experts, model.topk, model.moe_ffn, AUX_LOSS, "aux_loss", False, False,
                 ep, tp, tp, False, "local", "torch"), name)
            state = ckpt["model"]
            # Megatron-Core's GPTModel state dict is flat: no language_model nesting.
            self.assertTrue(all(not isinstance(v, dict) for v in state.values()), name)
            layer0 = [k for k in state if k.startswith("decoder.layers.0.")]
            self.assertEqual(layer0, LAYER0_DENSE + [n % lo for lo in range(local)
                                                     for n in LAYER0_EXPERT], name)
            want = megatron_rank(model, t, tp, e, ep)
            self.assertEqual(list(state), list(want), name)
            for key, value in want.items():
                self.assertTrue(torch.equal(state[key], torch.from_numpy(value)),
                                "%s: %s differs" % (name, key))
        return mg, hf

    def check_read_back(self, mg, model, ep):
        """reshard's own megatron reader: every expert under its global id, the EP it was
        written at, and the exact tensors."""
        res = self.ctl("inspect", mg)
        self.assertExit(res, 0)
        self.assertIn("x EP%d, %d experts" % (ep, model.experts), res.text)
        self.assertIn("--family auto: mixtral", res.text)
        merged = self.p("merged")
        self.assertExit(self.ctl("consolidate", mg, merged, "--no-progress"), 0)
        got = self.read_output(merged)
        for key, want in consolidated_megatron(model).items():
            self.assertIn(key, got)
            self.assertTrue(torch.equal(got[key], torch.from_numpy(want)), "%s differs" % key)

    def round_trip(self, seed, tp, ep):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=seed)
        mg, hf = self.import_and_check(model, tp, ep)
        self.check_read_back(mg, model, ep)
        back = self.p("back")
        self.export(mg, back)
        self.check_tensors(back, hf)
        self.check_mixtral_config(back, model)

    def test_round_trip_tp2(self):
        self.round_trip(seed=8, tp=2, ep=1)

    def test_round_trip_tp2_ep2(self):
        self.round_trip(seed=10, tp=2, ep=2)

    def test_round_trip_tp2_pp2(self):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=9)
        folder, hf = self.hf_folder(model)
        mg = self.p("megatron")
        self.assertExit(self.ctl("reshard", folder, mg, "--format", "megatron", "--parts", 2,
                                 "--pipeline-parts", 2, "--no-progress"), 0)
        self.assertEqual(sorted(os.listdir(os.path.join(mg, "release"))),
                         ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"])
        back = self.p("back")
        self.export(mg, back)
        self.check_tensors(back, hf)
        self.check_mixtral_config(back, model)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
