"""End-to-end tests of `reshardctl reshard HF_DIR OUT --format megatron --parts TP
--pipeline-parts PP` (lib/formats/hf/hf_import.h): a Hugging Face model folder (safetensors and
config.json, as save_pretrained writes them) of each family imported into Megatron-LM's legacy
TP x PP layout, and back with `reshardctl consolidate OUT BACK --format hf`.

Run:  /usr/bin/python3 tests/hf_import_e2e_test.py --reshardctl PATH [unittest args]

The HF state dicts are random (tests/fixtures/hf_megatron_fixture.py for the Llama family, a
GPT-2 one here). Every model_optim_rng.pt is loaded with real torch and compared tensor by
tensor (torch.equal) with Megatron's layout computed here in numpy from the HF tensors
(`megatron_rank`), never by reshard: fused QKV per query group, [gate_t; up_t] per TP rank,
row / column splits, the vocabulary padded with zero rows to a multiple of 128 x TP, PP stages
holding their layers under stage-local numbers. The round trip back to HF must give the original
tensors bit for bit and config.json's sizes.
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
import dcp_output_test as O  # noqa: E402
import hf_megatron_fixture as hmf  # noqa: E402
import torch_dist_output_e2e_test as TDO  # noqa: E402
from st_torch import read_folder, write_file  # noqa: E402

DIVISIBLE_BY = 128  # Megatron-LM's default make_vocab_size_divisible_by
ARCHITECTURE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "gpt2": "GPT2LMHeadModel"}
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def padded_vocab(vocab, tp):
    multiple = DIVISIBLE_BY * tp
    return (vocab + multiple - 1) // multiple * multiple


def gpt2_state_dict(layers, hidden, vocab, positions, seed):
    """A GPT-2 model's tensors under transformers' names (Conv1D weights [in, out])."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    out = collections.OrderedDict()
    out["transformer.wte.weight"] = r(vocab, hidden)
    out["transformer.wpe.weight"] = r(positions, hidden)
    for i in range(layers):
        p = "transformer.h.%d." % i
        out[p + "ln_1.weight"], out[p + "ln_1.bias"] = r(hidden), r(hidden)
        out[p + "attn.c_attn.weight"], out[p + "attn.c_attn.bias"] = (
            r(hidden, 3 * hidden), r(3 * hidden))
        out[p + "attn.c_proj.weight"], out[p + "attn.c_proj.bias"] = r(hidden, hidden), r(hidden)
        out[p + "ln_2.weight"], out[p + "ln_2.bias"] = r(hidden), r(hidden)
        out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = (
            r(hidden, 4 * hidden), r(4 * hidden))
        out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = (
            r(4 * hidden, hidden), r(hidden))
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = r(hidden), r(hidden)
    return out


class Model(object):
    """One HF model: family, sizes, state dict and config.json."""

    def __init__(self, family, layers=6, hidden=16, heads=4, groups=2, head_dim=None, ffn=24,
                 vocab=300, tied=False, seed=0, rope_scaling=None, dtype=torch.float32):
        self.family, self.layers, self.hidden, self.heads = family, layers, hidden, heads
        self.dtype = dtype
        self.groups = heads if family == "gpt2" else groups
        self.head_dim = head_dim or hidden // heads
        self.ffn = 4 * hidden if family == "gpt2" else ffn
        self.vocab, self.tied = vocab, True if family == "gpt2" else tied
        self.positions = 32
        if family == "gpt2":
            self.hf = gpt2_state_dict(layers, hidden, vocab, self.positions, seed)
            self.config = {
                "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": vocab, "n_positions": self.positions, "n_embd": hidden,
                "n_layer": layers, "n_head": heads, "n_inner": None,
                "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                "tie_word_embeddings": True, "torch_dtype": "float32"}
        else:
            spec = hmf.Spec(family=family, layers=layers, hidden=hidden, heads=heads,
                            groups=groups, head_dim=head_dim, ffn=ffn, vocab=vocab, tied=tied,
                            seed=seed)
            self.hf = hmf.hf_state_dict(spec)
            self.config = {
                "architectures": [ARCHITECTURE[family]], "model_type": family,
                "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": groups,
                "head_dim": self.head_dim, "hidden_act": "silu",
                "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
                "rope_scaling": rope_scaling, "vocab_size": vocab, "tie_word_embeddings": tied,
                "torch_dtype": "float32"}
            if family == "mistral":
                self.config["sliding_window"] = 4096
            else:
                self.config["attention_bias"] = family == "qwen2"
        if dtype == torch.bfloat16:
            # bf16 weights, kept here as the float32 numbers they are (exactly).
            self.hf = collections.OrderedDict(
                (k, torch.from_numpy(v).to(dtype).float().numpy()) for k, v in self.hf.items())
            self.config["torch_dtype"] = "bfloat16"

    def save(self, folder, shards=2, torch_bin=False):
        """save_pretrained's layout: model-0000i-of-0000N.safetensors, the index, config.json;
        with torch_bin, save_pretrained(safe_serialization=False)'s: torch.save state dicts in
        pytorch_model-0000i-of-0000N.bin and pytorch_model.bin.index.json (one shard:
        pytorch_model.bin and no index)."""
        os.makedirs(folder)
        names = list(self.hf)
        per = (len(names) + shards - 1) // shards
        weight_map = {}
        total = 0
        for i in range(shards):
            if torch_bin:
                file = ("pytorch_model.bin" if shards == 1 else
                        "pytorch_model-%05d-of-%05d.bin" % (i + 1, shards))
            else:
                file = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
            part = collections.OrderedDict(
                (n, torch.from_numpy(self.hf[n]).to(self.dtype))
                for n in names[i * per:(i + 1) * per])
            if torch_bin:
                torch.save(part, os.path.join(folder, file))
            else:
                write_file(os.path.join(folder, file), part)
            weight_map.update({n: file for n in part})
            total += sum(t.numel() * t.element_size() for t in part.values())
        if torch_bin and shards > 1:
            with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
                f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                   indent=2, sort_keys=True) + "\n")
        elif not torch_bin:
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": weight_map}, f)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(self.config, f)
        return folder


def megatron_layer(m, i, t, tp):
    """Layer i's tensors on TP rank t, as Megatron-LM's ParallelTransformerLayer keys them."""
    ng, nh, d = m.groups, m.heads, m.head_dim
    out = collections.OrderedDict()
    if m.family == "gpt2":
        p = "transformer.h.%d." % i
        h = m.hidden
        # c_attn's transpose holds [Q; K; V] as rows; Megatron's rows are [nh, 3, d].
        w = m.hf[p + "attn.c_attn.weight"].T.reshape(3, nh, d, h).transpose(1, 0, 2, 3)
        b = m.hf[p + "attn.c_attn.bias"].reshape(3, nh, d).transpose(1, 0, 2)
        local = nh // tp
        out["input_layernorm.weight"] = m.hf[p + "ln_1.weight"]
        out["input_layernorm.bias"] = m.hf[p + "ln_1.bias"]
        out["self_attention.query_key_value.weight"] = (
            w[t * local:(t + 1) * local].reshape(-1, h))
        out["self_attention.query_key_value.bias"] = b[t * local:(t + 1) * local].reshape(-1)
        out["self_attention.dense.weight"] = np.split(m.hf[p + "attn.c_proj.weight"].T, tp,
                                                      axis=1)[t]
        out["self_attention.dense.bias"] = m.hf[p + "attn.c_proj.bias"]
        out["post_attention_layernorm.weight"] = m.hf[p + "ln_2.weight"]
        out["post_attention_layernorm.bias"] = m.hf[p + "ln_2.bias"]
        out["mlp.dense_h_to_4h.weight"] = np.split(m.hf[p + "mlp.c_fc.weight"].T, tp, axis=0)[t]
        out["mlp.dense_h_to_4h.bias"] = np.split(m.hf[p + "mlp.c_fc.bias"], tp, axis=0)[t]
        out["mlp.dense_4h_to_h.weight"] = np.split(m.hf[p + "mlp.c_proj.weight"].T, tp,
                                                   axis=1)[t]
        out["mlp.dense_4h_to_h.bias"] = m.hf[p + "mlp.c_proj.bias"]
        return out
    p = "model.layers.%d." % i
    r = nh // ng

    def fused(kind):
        q, k, v = (m.hf[p + "self_attn.%s_proj.%s" % (x, kind)] for x in "qkv")
        cols = q.shape[1:]
        grouped = np.concatenate([q.reshape(ng, r, d, *cols), k.reshape(ng, 1, d, *cols),
                                  v.reshape(ng, 1, d, *cols)], axis=1)
        local = ng // tp
        return grouped[t * local:(t + 1) * local].reshape(-1, *cols)
    out["input_layernorm.weight"] = m.hf[p + "input_layernorm.weight"]
    out["self_attention.query_key_value.weight"] = fused("weight")
    if m.family == "qwen2":
        out["self_attention.query_key_value.bias"] = fused("bias")
    if m.family == "qwen3":
        out["self_attention.q_layernorm.weight"] = m.hf[p + "self_attn.q_norm.weight"]
        out["self_attention.k_layernorm.weight"] = m.hf[p + "self_attn.k_norm.weight"]
    out["self_attention.dense.weight"] = np.split(m.hf[p + "self_attn.o_proj.weight"], tp,
                                                  axis=1)[t]
    out["post_attention_layernorm.weight"] = m.hf[p + "post_attention_layernorm.weight"]
    out["mlp.dense_h_to_4h.weight"] = np.concatenate(
        [np.split(m.hf[p + "mlp.gate_proj.weight"], tp, axis=0)[t],
         np.split(m.hf[p + "mlp.up_proj.weight"], tp, axis=0)[t]], axis=0)
    out["mlp.dense_4h_to_h.weight"] = np.split(m.hf[p + "mlp.down_proj.weight"], tp, axis=1)[t]
    return out


def padded_rows(m, table, tp):
    """A vocabulary table with zero rows appended up to a multiple of 128 x TP."""
    pad = np.zeros((padded_vocab(m.vocab, tp) - m.vocab, m.hidden), np.float32)
    return np.concatenate([table, pad])


def final_norm(m):
    """The final norm's tensors by their key below Megatron's encoder (decoder)."""
    if m.family != "gpt2":
        return {"final_layernorm.weight": m.hf["model.norm.weight"]}
    return {"final_layernorm.weight": m.hf["transformer.ln_f.weight"],
            "final_layernorm.bias": m.hf["transformer.ln_f.bias"]}


def megatron_rank(m, t, tp, p, pp):
    """Every tensor of rank (t, p)'s model_optim_rng.pt, by its dotted path below "model"."""
    gpt2 = m.family == "gpt2"
    embed = m.hf["transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"]

    def vocab_slice(table):
        return np.split(padded_rows(m, table, tp), tp, axis=0)[t]
    out = collections.OrderedDict()
    per = m.layers // pp
    if p == 0:
        out["language_model.embedding.word_embeddings.weight"] = vocab_slice(embed)
        if gpt2:
            out["language_model.embedding.position_embeddings.weight"] = m.hf[
                "transformer.wpe.weight"]
    for local, i in enumerate(range(p * per, (p + 1) * per)):
        for key, value in megatron_layer(m, i, t, tp).items():
            out["language_model.encoder.layers.%d.%s" % (local, key)] = value
    if p == pp - 1:
        for key, value in final_norm(m).items():
            out["language_model.encoder." + key] = value
        if not m.tied:
            out["language_model.output_layer.weight"] = vocab_slice(m.hf["lm_head.weight"])
        elif pp > 1:
            out["word_embeddings_for_head.weight"] = vocab_slice(embed)
    return out


def flatten(node, prefix=""):
    out = collections.OrderedDict()
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(flatten(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-hf-import"
    TIMEOUT = 60

    def import_(self, folder, out, tp, pp, *extra):
        return self.ctl("reshard", folder, out, "--format", "megatron", "--parts", tp,
                        "--pipeline-parts", pp, "--no-progress", *extra)

    def refused(self, folder, args, message):
        """Exit 3, the message holds `message`, and OUT is not created."""
        out = self.p("refused-out")
        res = self.ctl("reshard", folder, out, "--format", "megatron", "--no-progress", *args)
        self.assertExit(res, 3)
        self.assertIn(message, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "%s created by a refused import" % out)


class ImportTests(Base):
    def check_megatron(self, m, out, tp, pp):
        with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
            self.assertEqual(f.read(), "release")
        self.assertEqual(sorted(os.listdir(os.path.join(out, "release"))), sorted(
            "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            for t in range(tp) for p in range(pp)))
        for t in range(tp):
            for p in range(pp):
                name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
                ckpt = torch.load(os.path.join(out, "release", name, "model_optim_rng.pt"))
                self.assertEqual(list(ckpt), ["args", "checkpoint_version", "iteration", "model"])
                self.assertEqual(ckpt["checkpoint_version"], 3.0)
                self.assertEqual(ckpt["iteration"], 0)
                got = flatten(ckpt["model"])
                want = megatron_rank(m, t, tp, p, pp)
                self.assertEqual(list(got), list(want), name)
                for key, value in want.items():
                    self.assertEqual(got[key].dtype, m.dtype, key)
                    self.assertTrue(torch.equal(got[key].float(), torch.from_numpy(
                        np.ascontiguousarray(value))), "%s: %s differs" % (name, key))
                self.check_args(m, ckpt["args"], tp, pp, t, p)

    def check_args(self, m, args, tp, pp, t, p):
        gpt2 = m.family == "gpt2"
        want = {
            "num_layers": m.layers, "hidden_size": m.hidden, "ffn_hidden_size": m.ffn,
            "num_attention_heads": m.heads, "num_query_groups": m.groups,
            "group_query_attention": m.groups != m.heads, "kv_channels": m.head_dim,
            "vocab_size": m.vocab, "make_vocab_size_divisible_by": DIVISIBLE_BY,
            "padded_vocab_size": padded_vocab(m.vocab, tp),
            "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
            "world_size": tp * pp, "rank": t + tp * p, "swiglu": not gpt2,
            "untie_embeddings_and_output_weights": not m.tied,
            "qk_layernorm": m.family == "qwen3", "params_dtype": m.dtype,
            "bf16": m.dtype == torch.bfloat16, "fp16": False,
            "normalization": "LayerNorm" if gpt2 else "RMSNorm",
            "position_embedding_type": "learned_absolute" if gpt2 else "rope",
            "max_position_embeddings": m.positions if gpt2 else 128,
        }
        if gpt2:
            want.update(add_bias_linear=True, openai_gelu=True, norm_epsilon=1e-5)
        else:
            want.update(add_qkv_bias=m.family == "qwen2", add_bias_linear=False,
                        rotary_base=500000, norm_epsilon=1e-6,
                        use_rope_scaling=m.config["rope_scaling"] is not None)
        if m.family == "mistral":
            want["sliding_window"] = 4096
        self.assertIsInstance(args, argparse.Namespace)
        self.assertEqual({k: getattr(args, k, "<absent>") for k in want}, want)

    def check_back(self, m, back):
        got = read_folder(back)
        self.assertEqual(sorted(got), sorted(m.hf), "tensor names")
        for name, value in m.hf.items():
            self.assertEqual(got[name].dtype, m.dtype, name)
            self.assertTrue(torch.equal(got[name].float(), torch.from_numpy(value)),
                            "%s differs" % name)
        with open(os.path.join(back, "config.json")) as f:
            config = json.load(f)
        for key, value in m.config.items():
            if key == "n_inner":
                continue  # null means 4 x n_embd; the export writes it so too
            self.assertEqual(config.get(key, "<absent>"), value, "config.json " + key)

    def run_model(self, m, topologies, hf_dir=None):
        hf_dir = hf_dir or m.save(self.p("hf"))
        for tp, pp in topologies:
            with self.subTest(tp=tp, pp=pp):
                out = self.p("megatron-tp%d-pp%d" % (tp, pp))
                res = self.import_(hf_dir, out, tp, pp)
                self.assertExit(res, 0)
                self.check_megatron(m, out, tp, pp)
                back = self.p("back-tp%d-pp%d" % (tp, pp))
                self.assertExit(self.ctl("consolidate", out, back, "--format", "hf",
                                         "--no-progress"), 0)
                self.check_back(m, back)

    ALL = [(1, 1), (2, 1), (2, 2), (4, 1), (1, 3)]


class LlamaMistralImportTests(ImportTests):
    def test_llama_gqa_untied_padded_vocab_rope_scaling(self):
        # 8 heads in 4 groups (r = 2), vocabulary 1000: not a multiple of 128 x TP.
        self.run_model(Model("llama", hidden=32, heads=8, groups=4, vocab=1000,
                             rope_scaling=LLAMA31_ROPE), self.ALL)

    def test_llama_one_group_tied(self):
        self.run_model(Model("llama", heads=4, groups=1, tied=True, seed=1), [(1, 1), (1, 3)])

    def test_mistral_groups_equal_heads_tied(self):
        self.run_model(Model("mistral", heads=4, groups=4, tied=True, seed=2), self.ALL)


class QwenGpt2ImportTests(ImportTests):
    def test_qwen2_qkv_bias(self):
        self.run_model(Model("qwen2", hidden=32, heads=8, groups=4, vocab=50, seed=3), self.ALL)

    def test_qwen3_qk_norm_head_dim_bf16(self):
        # head_dim 8 != hidden / heads; bf16 weights (params_dtype, bf16 in the args).
        self.run_model(Model("qwen3", heads=4, groups=2, head_dim=8, seed=4,
                             dtype=torch.bfloat16),
                       [(1, 1), (2, 1), (2, 2), (1, 3)])

    def test_gpt2_odd_vocabulary(self):
        # 257 rows: not even divisible by TP 2; the padding makes it 256 x TP rows.
        self.run_model(Model("gpt2", vocab=257, seed=5), self.ALL)


def megatron_core_checkpoint(m, tp):
    """Every tensor of the Megatron-Core torch_dist checkpoint of `m` for TP `tp`, by key, as
    Megatron-Core's GPTModel (Transformer Engine spec) saves it: each layer tensor the layer's
    whole Megatron-LM tensor (megatron_layer at TP 1) stacked over all layers under
    `decoder.layers.<rest>` (Megatron-Core's names from TDO.LEGACY_TO_CORE), the vocabulary
    padded with zero rows to a multiple of 128 x TP, no output layer when tied."""
    gpt2 = m.family == "gpt2"
    out = {"embedding.word_embeddings.weight": padded_rows(
        m, m.hf["transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"], tp)}
    if gpt2:
        out["embedding.position_embeddings.weight"] = m.hf["transformer.wpe.weight"]
    layers = [megatron_layer(m, i, 0, 1) for i in range(m.layers)]
    for legacy in layers[0]:
        core = TDO.LEGACY_TO_CORE.get(legacy, legacy)  # q/k layernorms keep their names
        out["decoder.layers." + core] = np.stack([layer[legacy] for layer in layers])
    for key, value in final_norm(m).items():
        out["decoder." + key] = value
    if not m.tied:
        out["output_layer.weight"] = padded_rows(m, m.hf["lm_head.weight"], tp)
    return out


class TorchDistImportTests(ImportTests):
    """`reshard HF_DIR OUT --parts N --format megatron-torch-dist`, read back with real torch
    (common.pt by torch.load, `.metadata` and every chunk by tests/dcp_output_test.py's reader),
    and back to HF."""

    def check_torch_dist(self, m, out, tp):
        with open(os.path.join(out, "latest_checkpointed_iteration.txt")) as f:
            self.assertEqual(f.read(), "release")
        folder = os.path.join(out, "release")
        self.assertEqual(sorted(os.listdir(folder)), sorted(
            [".metadata", "common.pt", "metadata.json"] +
            ["__%d_0.distcp" % r for r in range(tp)]))
        common = torch.load(os.path.join(folder, "common.pt"), map_location="cpu")
        self.assertEqual(list(common), ["args", "checkpoint_version", "iteration"])
        self.assertEqual((common["checkpoint_version"], common["iteration"]), (3.0, 0))
        self.check_args(m, common["args"], tp, 1, 0, 0)
        md, got = O.read_dcp(folder)  # every tensor's chunks tile it exactly once
        want = megatron_core_checkpoint(m, tp)
        self.assertEqual(sorted(got), sorted(want))
        for key, value in want.items():
            self.assertEqual(got[key].dtype, m.dtype, key)
            self.assertTrue(torch.equal(got[key].float(), torch.from_numpy(
                np.ascontiguousarray(value))), "%s differs" % key)
        # The vocabulary in TP row blocks of padded_vocab / TP rows, rank r's in __r_0.distcp.
        rows = padded_vocab(m.vocab, tp) // tp
        entry = md.state_dict_metadata["embedding.word_embeddings.weight"]
        self.assertEqual(
            [(tuple(c.offsets), tuple(c.sizes),
              md.storage_data[O.MetadataIndex_("embedding.word_embeddings.weight",
                                               c.offsets)].relative_path)
             for c in entry.chunks],
            [((r * rows, 0), (rows, m.hidden), "__%d_0.distcp" % r) for r in range(tp)])

    def run_torch_dist(self, m):
        hf_dir = m.save(self.p("hf"))
        for tp in (1, 2):
            with self.subTest(tp=tp):
                out = self.p("torch-dist-tp%d" % tp)
                self.assertExit(self.ctl("reshard", hf_dir, out, "--format",
                                         "megatron-torch-dist", "--parts", tp,
                                         "--no-progress"), 0)
                self.check_torch_dist(m, out, tp)
                back = self.p("back-tp%d" % tp)
                self.assertExit(self.ctl("consolidate", out, back, "--format", "hf",
                                         "--no-progress"), 0)
                self.check_back(m, back)

    def test_llama_gqa_untied_padded_vocab(self):
        # 8 heads in 4 groups, vocabulary 1000: zero rows up to 1024 (TP 1) and 1024 (TP 2).
        self.run_torch_dist(Model("llama", layers=3, hidden=32, heads=8, groups=4, vocab=1000,
                                  seed=6))

    def test_qwen3_qk_norm_head_dim(self):
        self.run_torch_dist(Model("qwen3", layers=2, heads=4, groups=2, head_dim=8, vocab=300,
                                  seed=7))

    def test_gpt2_tied_odd_vocabulary(self):
        self.run_torch_dist(Model("gpt2", layers=2, vocab=257, seed=8))


class TorchDistPolishTests(ImportTests):
    """--pipeline-parts with torch_dist output, its messages, inspect of its common.pt, and
    torch_dist input to the legacy layout without --rules."""

    def model(self):
        return Model("llama", layers=4, hidden=32, heads=8, groups=4, vocab=1000, seed=9)

    def torch_dist(self, m, tp, *extra):
        out = self.p("torch-dist-tp%d" % tp)
        self.assertExit(self.ctl("reshard", m.save(self.p("hf")), out, "--format",
                                 "megatron-torch-dist", "--parts", tp, "--no-progress",
                                 *extra), 0)
        return out

    def test_pipeline_parts_are_recorded_in_the_args(self):
        m = self.model()
        out = self.torch_dist(m, 2, "--pipeline-parts", 2)
        common = torch.load(os.path.join(out, "release", "common.pt"), map_location="cpu")
        # As Megatron saves them: TP 2 x PP 2 (world size 4), rank 0's args.
        self.check_args(m, common["args"], 2, 2, 0, 0)
        # Layers that the stages cannot share evenly are refused, naming both.
        res = self.ctl("reshard", self.p("hf"), self.p("uneven"), "--format",
                       "megatron-torch-dist", "--parts", 1, "--pipeline-parts", 3,
                       "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("--pipeline-parts 3 does not divide the 4 layers evenly", res.text,
                      self.describe(res))
        self.assertFalse(os.path.exists(self.p("uneven")))

    def test_messages_name_megatron_core_torch_dist(self):
        def refused(m, message):
            hf_dir = m.save(self.p("hf-%d" % len(os.listdir(self.tmp))))
            out = self.p("refused-out")
            res = self.ctl("reshard", hf_dir, out, "--format", "megatron-torch-dist",
                           "--parts", 2, "--no-progress")
            self.assertExit(res, 3)
            self.assertIn(message, res.text, self.describe(res))
            self.assertNotIn("Megatron-LM", res.text, self.describe(res))
            self.assertFalse(os.path.exists(out))
            return hf_dir
        m = self.model()
        m.hf["model.layers.1.mlp.router.weight"] = np.zeros((4, 32), np.float32)
        refused(m, "tensor \"model.layers.1.mlp.router.weight\" has no Megatron-Core torch_dist "
                   "counterpart in a llama model")
        m = self.model()
        m.config["model_type"] = "falcon"
        refused(m, "which is none of the families reshard imports into Megatron-Core "
                   "torch_dist: llama, mistral, qwen2, qwen3, gpt2")
        m = self.model()
        del m.config["num_hidden_layers"]
        refused(m, "has no num_hidden_layers, which the Megatron-Core torch_dist args need")

    def test_inspect_says_where_common_args_go(self):
        out = self.torch_dist(self.model(), 1)
        entries = [e for e in self.inspect_json(out)["other_entries"]
                   if e.startswith("common.args: ")]
        self.assertEqual(len(entries), 1, entries)
        self.assertTrue(entries[0].endswith(
            " (carried: --format hf writes config.json from them, --format megatron and "
            "megatron-torch-dist write them with the output's TP and PP)"), entries[0])

    def test_torch_dist_input_to_legacy_tp_pp_without_rules(self):
        # HF -> torch_dist TP 2 (checked against Megatron-Core's layout computed in numpy) ->
        # legacy TP x PP with no --rules: every rank file against megatron_rank's numpy.
        m = self.model()
        src = self.torch_dist(m, 2)
        TorchDistImportTests.check_torch_dist(self, m, src, 2)
        for tp, pp in ((2, 2), (4, 1), (1, 1)):
            with self.subTest(tp=tp, pp=pp):
                out = self.p("legacy-tp%d-pp%d" % (tp, pp))
                self.assertExit(self.import_(src, out, tp, pp), 0)
                self.check_megatron(m, out, tp, pp)


class TiedHeadTests(ImportTests):
    """A tied model whose safetensors also hold lm_head.weight."""

    def model(self):
        m = Model("llama", layers=2, heads=4, groups=2, vocab=300, tied=True, seed=10)
        m.hf["lm_head.weight"] = m.hf["model.embed_tokens.weight"].copy()
        return m

    def test_saved_head_equal_to_the_embedding_is_left_out(self):
        m = self.model()
        out = self.p("megatron")
        self.assertExit(self.import_(m.save(self.p("hf")), out, 2, 1), 0)
        del m.hf["lm_head.weight"]
        self.check_megatron(m, out, 2, 1)

    def test_saved_head_differing_from_the_embedding_is_refused(self):
        m = self.model()
        # Element 1234 = row 77, column 2 (hidden 16).
        m.hf["lm_head.weight"][77, 2] += 1.0
        hf_dir = m.save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "1"],
                     os.path.join(hf_dir, "model-00002-of-00002.safetensors") +
                     ": tensor \"lm_head.weight\" differs from tensor "
                     "\"model.embed_tokens.weight\" first at element 1234 (row 77, column 2), "
                     "but " + os.path.join(hf_dir, "config.json") + " says "
                     "tie_word_embeddings: true")


class ImportRefusalTests(Base):
    def model(self, **kw):
        return Model("llama", layers=2, heads=8, groups=4, hidden=32, **kw)

    def test_heads_not_divisible_by_tp(self):
        hf_dir = self.model().save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "3"],
                     "8 attention heads in 4 query groups do not divide into TP 3: Megatron "
                     "keeps whole heads and query groups on every tensor-parallel rank")

    def test_heads_not_divisible_by_groups(self):
        m = self.model()
        m.config["num_key_value_heads"] = 3
        hf_dir = m.save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "1"],
                     "num_attention_heads 8 is not divisible by num_key_value_heads 3")

    def test_unknown_family_lists_the_families(self):
        m = self.model()
        m.config["model_type"] = "falcon"
        m.config["architectures"] = ["FalconForCausalLM"]
        hf_dir = m.save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "1"],
                     "model_type \"falcon\" (architectures \"FalconForCausalLM\"), which is none "
                     "of the families reshard imports into Megatron-LM: llama, mistral, qwen2, "
                     "qwen3, gpt2, mixtral")

    def test_missing_config_json(self):
        hf_dir = self.model().save(self.p("hf"))
        os.remove(os.path.join(hf_dir, "config.json"))
        self.refused(hf_dir, ["--parts", "1"],
                     os.path.join(hf_dir, "config.json") + " not found: a Hugging Face model is "
                     "imported into Megatron-LM with the config.json save_pretrained writes")

    def test_tensor_without_megatron_counterpart(self):
        m = self.model()
        m.hf["model.layers.1.mlp.router.weight"] = np.zeros((4, 32), np.float32)
        hf_dir = m.save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "2"],
                     "tensor \"model.layers.1.mlp.router.weight\" has no Megatron-LM counterpart "
                     "in a llama model")


class OverrideImportTests(ImportTests):
    """--config FILE in place of config.json, --family over its architectures."""

    def test_config_file_stands_in_for_a_missing_config_json(self):
        m = Model("llama", layers=2, heads=4, groups=2, vocab=300, seed=11)
        hf_dir = m.save(self.p("hf"))
        config = self.p("llama-config.json")
        os.rename(os.path.join(hf_dir, "config.json"), config)
        out = self.p("megatron")
        self.assertExit(self.import_(hf_dir, out, 2, 2, "--config", config), 0)
        self.check_megatron(m, out, 2, 2)

    def test_config_file_replaces_the_folders(self):
        m = Model("qwen2", layers=2, heads=4, groups=2, vocab=300, seed=12)
        hf_dir = m.save(self.p("hf"))
        # The folder's config.json is wrong; --config's is the model's.
        with open(os.path.join(hf_dir, "config.json"), "w") as f:
            json.dump(dict(m.config, hidden_size=64, model_type="falcon"), f)
        config = self.p("qwen2.json")
        with open(config, "w") as f:
            json.dump(m.config, f)
        out = self.p("torch-dist")
        res = self.ctl("reshard", hf_dir, out, "--format", "megatron-torch-dist", "--parts", 2,
                       "--config", config, "--no-progress")
        self.assertExit(res, 0)
        TorchDistImportTests.check_torch_dist(self, m, out, 2)

    def test_family_overrides_architectures(self):
        m = Model("mistral", layers=2, heads=4, groups=2, vocab=300, seed=13)
        config = dict(m.config, model_type="my_mistral", architectures=["MyMistralForCausalLM"])
        m_saved = m.save(self.p("hf"))
        with open(os.path.join(m_saved, "config.json"), "w") as f:
            json.dump(config, f)
        out = self.p("megatron")
        self.assertExit(self.import_(m_saved, out, 1, 1, "--family", "mistral"), 0)
        self.check_megatron(m, out, 1, 1)

    def test_config_disagreeing_with_tensor_shapes_is_refused(self):
        m = Model("llama", layers=2, heads=4, groups=2, vocab=300, seed=14)
        hf_dir = m.save(self.p("hf"))
        config = self.p("wrong.json")
        with open(config, "w") as f:
            json.dump(dict(m.config, intermediate_size=32), f)
        self.refused(hf_dir, ["--parts", "1", "--config", config],
                     "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [24, 16], but %s "
                     "makes it [32, 16]" % config)

    def test_unknown_family_lists_the_families(self):
        hf_dir = Model("llama", layers=1, seed=15).save(self.p("hf"))
        self.refused(hf_dir, ["--parts", "1", "--family", "falcon"],
                     "--family falcon: unknown model family; the families reshard imports into "
                     "Megatron-LM are llama, mistral, qwen2, qwen3, gpt2")


class TorchBinFolderTests(ImportTests):
    """Hugging Face folders of torch.save files (save_pretrained(safe_serialization=False)):
    pytorch_model.bin, or pytorch_model-0000K-of-0000N.bin with pytorch_model.bin.index.json."""

    def save_with_tokenizer(self, m, shards):
        hf_dir = m.save(self.p("hf"), shards=shards, torch_bin=True)
        with open(os.path.join(hf_dir, "tokenizer.json"), "w") as f:
            f.write('{"version": "1.0"}')
        return hf_dir

    def test_sharded_import_inspect_and_consolidate(self):
        m = Model("llama", layers=3, heads=4, groups=2, vocab=300, seed=21)
        hf_dir = self.save_with_tokenizer(m, 3)
        doc = self.inspect_json(hf_dir)
        self.assertEqual(doc["description"],
                         "Hugging Face model folder (torch.save files), one model in 3 shards")
        self.assertEqual(sorted(os.path.basename(f["path"]) for f in doc["model_files"]),
                         ["config.json", "tokenizer.json"])
        self.run_model(m, [(2, 1), (1, 3)], hf_dir)
        # consolidate: the weights as torch.load reads them, and the folder's other files.
        flat = self.p("flat")
        self.assertExit(self.ctl("consolidate", hf_dir, flat, "--no-progress"), 0)
        got = read_folder(flat)
        want = {}
        for name in sorted(os.listdir(hf_dir)):
            if name.endswith(".bin"):
                want.update(torch.load(os.path.join(hf_dir, name)))
        self.assertEqual(sorted(got), sorted(want))
        for name, value in want.items():
            self.assertTrue(torch.equal(got[name], value), name)
        for name in ("config.json", "tokenizer.json"):
            with open(os.path.join(hf_dir, name), "rb") as a, \
                    open(os.path.join(flat, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_single_file_import_torch_dist(self):
        m = Model("gpt2", layers=2, vocab=257, seed=22)
        hf_dir = self.save_with_tokenizer(m, 1)
        self.assertEqual(sorted(os.listdir(hf_dir)),
                         ["config.json", "pytorch_model.bin", "tokenizer.json"])
        self.assertEqual(self.inspect_json(hf_dir)["description"],
                         "Hugging Face model folder (torch.save files), one file")
        out = self.p("torch-dist")
        res = self.ctl("reshard", hf_dir, out, "--format", "megatron-torch-dist", "--parts", 2,
                       "--no-progress")
        self.assertExit(res, 0)
        TorchDistImportTests.check_torch_dist(self, m, out, 2)

    def test_index_naming_a_missing_file(self):
        m = Model("llama", layers=2, heads=4, groups=2, vocab=300, seed=23)
        hf_dir = self.save_with_tokenizer(m, 2)
        missing = os.path.join(hf_dir, "pytorch_model-00002-of-00002.bin")
        os.remove(missing)
        index = os.path.join(hf_dir, "pytorch_model.bin.index.json")
        with open(index) as f:
            first = sorted(n for n, file in json.load(f)["weight_map"].items()
                           if file == os.path.basename(missing))[0]
        self.refused(hf_dir, ["--parts", "1"],
                     "%s not found: %s maps tensor \"%s\" to it" % (missing, index, first))

    def test_tensor_in_two_files(self):
        m = Model("llama", layers=2, heads=4, groups=2, vocab=300, seed=24)
        hf_dir = self.save_with_tokenizer(m, 2)
        # The second shard also holds the embedding, which the index maps to the first.
        second = os.path.join(hf_dir, "pytorch_model-00002-of-00002.bin")
        state = torch.load(second)
        state["model.embed_tokens.weight"] = torch.from_numpy(m.hf["model.embed_tokens.weight"])
        torch.save(state, second)
        self.refused(hf_dir, ["--parts", "1"],
                     "%s: tensor \"model.embed_tokens.weight\" is mapped to "
                     "pytorch_model-00001-of-00002.bin by %s" % (
                         second, os.path.join(hf_dir, "pytorch_model.bin.index.json")))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
