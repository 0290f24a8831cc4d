"""End-to-end tests of the Mixtral family of `--format hf` (lib/formats/hf): Megatron-Core
mixture-of-experts checkpoints saved in the legacy mp_rank_TT[_PPP]_EEE folders (8 experts over
EP 2, TP 2, SequentialMLP and TEGroupedMLP names), written with real torch by
tests/fixtures/megatron_moe_fixture.py, exported to a Hugging Face Mixtral folder, and a
Hugging Face Mixtral folder imported into Megatron-LM (`reshard --format megatron --parts TP`)
and exported back.

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


def megatron_rank(model, t, tp):
    """The flat model state of TP rank t of the Megatron-LM checkpoint the import writes (PP 1):
    Megatron-LM's legacy names, the vocabulary padded with zero rows to a multiple of 128 x TP,
    [gate_t; up_t] per expert, the router replicated."""
    padded = (VOCAB + 128 * tp - 1) // (128 * tp) * (128 * tp)

    def vocab_rows(table):
        full = np.zeros((padded, model.hidden), np.float32)
        full[:VOCAB] = table[:VOCAB]
        return moe._rows(full, t, tp)
    out = collections.OrderedDict()
    out["language_model.embedding.word_embeddings.weight"] = vocab_rows(model.embed)
    for i, lay in enumerate(model.layer):
        p = "language_model.encoder.layers.%d." % i
        out[p + "input_layernorm.weight"] = lay["qkv_norm"]
        out[p + "self_attention.query_key_value.weight"] = moe._rows(lay["qkv"], t, tp)
        out[p + "self_attention.dense.weight"] = moe._cols(lay["proj"], t, tp)
        out[p + "post_attention_layernorm.weight"] = lay["mlp_norm"]
        out[p + "mlp.router.weight"] = lay["router"]
        for e in range(model.experts):
            q = p + "mlp.experts.local_experts.%d." % e
            out[q + "dense_h_to_4h.weight"] = np.concatenate(
                [moe._rows(lay["gate"][e], t, tp), moe._rows(lay["up"][e], t, tp)])
            out[q + "dense_4h_to_h.weight"] = moe._cols(lay["down"][e], t, tp)
    out["language_model.encoder.final_layernorm.weight"] = model.final_norm
    out["language_model.output_layer.weight"] = vocab_rows(model.output)
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
    def run_case(self, grouped, pp=1, seed=3):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=seed)
        src = self.save(model, pp=pp, grouped=grouped)
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

    def test_round_trip_tp2(self):
        model = moe.MoE(shared_ffn=0, train_tp=2, seed=8)
        folder, hf = self.hf_folder(model)
        tp = 2
        mg = self.p("megatron")
        self.assertExit(self.ctl("reshard", folder, mg, "--format", "megatron", "--parts", tp,
                                 "--no-progress"), 0)
        for t in range(tp):
            ckpt = torch.load(os.path.join(mg, "release", "mp_rank_%02d" % t,
                                           "model_optim_rng.pt"))
            args = ckpt["args"]
            self.assertEqual((args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size,
                              args.moe_aux_loss_coeff, args.expert_model_parallel_size),
                             (model.experts, model.topk, model.moe_ffn, AUX_LOSS, 1))
            got = HI.flatten(ckpt["model"])
            want = megatron_rank(model, t, tp)
            self.assertEqual(list(got), list(want), "mp_rank_%02d" % t)
            for key, value in want.items():
                self.assertTrue(torch.equal(got[key], torch.from_numpy(value)),
                                "mp_rank_%02d: %s differs" % (t, key))
        back = self.p("back")
        res = self.export(mg, back)
        self.check_tensors(back, hf)
        self.check_mixtral_config(back, model)
        res = self.ctl("inspect", mg)
        self.assertExit(res, 0)
        self.assertIn("--family auto: mixtral", res.text)

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
