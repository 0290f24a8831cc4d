#!/usr/bin/python3
"""Write a synthetic Megatron-LM TP x PP checkpoint of a Llama-style model (RMSNorm, SwiGLU,
GQA, untied output layer) of a requested size, the input of the `--format hf` benchmark.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_megatron_llama_checkpoint.py --size 4GiB SAVE_DIR

Writes SAVE_DIR/latest_checkpointed_iteration.txt and SAVE_DIR/iter_0000100/mp_rank_TT_PPP/
model_optim_rng.pt, laid out as tests/fixtures/hf_megatron_fixture.py lays out a model
(Megatron-LM's names, the fused QKV per query group, [gate_t; up_t] per TP rank, layers split
evenly over the stages and numbered locally, the args Namespace): one rank's tensors in memory
at a time. F32; head_dim 128, 4 query heads per group, ffn 8/3 of hidden rounded up to 256,
vocabulary 32000; the largest hidden size (whole groups on every TP rank) at --layers, then the
most layers (whole stages), whose tensor data stays under SIZE. Prints a JSON summary.
"""

import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
import make_checkpoint as mc  # noqa: E402

import torch  # noqa: E402
import hf_megatron_fixture as hmf  # noqa: E402

HEAD_DIM = 128
HEADS_PER_GROUP = 4


def ffn_of(hidden):
    return mc.round_up(hidden * 8 // 3, 256)


def params_of(hidden, layers, vocab):
    heads = hidden // HEAD_DIM
    groups = heads // HEADS_PER_GROUP
    qkv = (heads + 2 * groups) * HEAD_DIM * hidden
    per_layer = qkv + hidden * hidden + 3 * ffn_of(hidden) * hidden + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="save folder to create; must not exist")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"))
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages (default 2)")
    ap.add_argument("--layers", type=int, default=16, help="at least (default 16)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tp, pp, layers, vocab = args.tp, args.pp, args.layers, args.vocab
    step = HEAD_DIM * HEADS_PER_GROUP * tp  # whole groups on every TP rank
    hidden = step
    while params_of(hidden + step, layers, vocab) * 4 <= args.size:
        hidden += step
    while params_of(hidden, layers + pp, vocab) * 4 <= args.size:
        layers += pp  # then more layers, PP whole stages at a time
    heads = hidden // HEAD_DIM
    groups = heads // HEADS_PER_GROUP
    ffn = ffn_of(hidden)
    spec = hmf.Spec("llama", layers=layers, hidden=hidden, heads=heads, groups=groups,
                    head_dim=HEAD_DIM, ffn=ffn, vocab=vocab, divisible_by=128, tied=False)
    padded = spec.padded_vocab(tp)
    assert layers % pp == 0 and groups % tp == 0 and ffn % tp == 0
    per = layers // pp
    g = torch.Generator().manual_seed(args.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    folder = os.path.join(args.out, "iter_0000100")
    total = 0
    for t in range(tp):
        for p in range(pp):
            lm = collections.OrderedDict()
            if p == 0:
                lm["embedding"] = {"word_embeddings": {"weight": rand(padded // tp, hidden)}}
            enc = collections.OrderedDict()
            for local in range(per):
                prefix = "layers.%d." % local
                enc[prefix + "input_layernorm.weight"] = rand(hidden)
                enc[prefix + "self_attention.query_key_value.weight"] = rand(
                    (heads + 2 * groups) * HEAD_DIM // tp, hidden)
                enc[prefix + "self_attention.dense.weight"] = rand(hidden, hidden // tp)
                enc[prefix + "post_attention_layernorm.weight"] = rand(hidden)
                enc[prefix + "mlp.dense_h_to_4h.weight"] = rand(2 * ffn // tp, hidden)
                enc[prefix + "mlp.dense_4h_to_h.weight"] = rand(hidden, ffn // tp)
            if p == pp - 1:
                enc["final_layernorm.weight"] = rand(hidden)
                lm["output_layer"] = {"weight": rand(padded // tp, hidden)}
            lm["encoder"] = enc
            for value in list(enc.values()) + [lm.get("embedding", {}).get(
                    "word_embeddings", {}).get("weight"), lm.get("output_layer", {}).get("weight")]:
                if value is not None:
                    total += value.numel() * 4
            ckpt = collections.OrderedDict()
            ckpt["args"] = hmf.megatron_args(spec, tp, pp, vocab_size=vocab)
            ckpt["args"].rank = p * tp + t
            ckpt["checkpoint_version"] = 3.0
            ckpt["iteration"] = 100
            ckpt["model"] = collections.OrderedDict(language_model=lm)
            name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            os.makedirs(os.path.join(folder, name))
            torch.save(ckpt, os.path.join(folder, name, "model_optim_rng.pt"))
            del ckpt, lm, enc
    with open(os.path.join(args.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("100")
    print(json.dumps({"total_size": total, "files": tp * pp, "hidden_size": hidden,
                      "num_attention_heads": heads, "num_key_value_heads": groups,
                      "intermediate_size": ffn, "num_hidden_layers": layers,
                      "vocab_size": vocab, "padded_vocab_size": padded, "tp": tp, "pp": pp}))


if __name__ == "__main__":
    main()
