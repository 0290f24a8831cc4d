#!/usr/bin/python3
"""Write a synthetic verl FSDP save of a Llama-style model (GQA, SwiGLU, RMSNorm, untied output
layer), the input of the verl consolidation benchmark.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_verl_checkpoint.py --world 4 SAVE_DIR

Writes SAVE_DIR/actor/model_world_size_{W}_rank_{r}.pt (a state dict of DTensors with the
Hugging Face names, each placed Shard(0) on a 1-d "fsdp" mesh of W ranks), fsdp_config.json and
huggingface/config.json, as verl's FSDPCheckpointManager saves them and as tests/verl_e2e_test.py
lays them out (its stand-ins for torch 2.x's DTensor classes, pickled under
torch.distributed.tensor's module paths). Only the rank's own rows of each tensor are made, one
rank's state dict in memory at a time. F32; defaults: hidden 2048, 20 layers, 16 heads / 4 KV
heads of 128, ffn 5632, vocabulary 32000 (4.13 GB of tensor data). Prints a JSON summary.
"""

import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
sys.dont_write_bytecode = True

import torch  # noqa: E402
import verl_e2e_test as V  # noqa: E402

HEAD_DIM = 128


def llama_shapes(hidden, layers, heads, kv_heads, ffn, vocab):
    """(Hugging Face name, full shape) of a LlamaForCausalLM state dict, in its order."""
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = "model.layers.%d." % i
        shapes += [(p + "self_attn.q_proj.weight", (heads * HEAD_DIM, hidden)),
                   (p + "self_attn.k_proj.weight", (kv_heads * HEAD_DIM, hidden)),
                   (p + "self_attn.v_proj.weight", (kv_heads * HEAD_DIM, hidden)),
                   (p + "self_attn.o_proj.weight", (hidden, heads * HEAD_DIM)),
                   (p + "mlp.gate_proj.weight", (ffn, hidden)),
                   (p + "mlp.up_proj.weight", (ffn, hidden)),
                   (p + "mlp.down_proj.weight", (hidden, ffn)),
                   (p + "input_layernorm.weight", (hidden,)),
                   (p + "post_attention_layernorm.weight", (hidden,))]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="save folder to create; must not exist")
    ap.add_argument("--world", type=int, default=4, help="FSDP ranks (default 4)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    world = args.world
    shapes = llama_shapes(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn,
                          args.vocab)
    for name, shape in shapes:
        if shape[0] % world:
            sys.exit("%s: %d rows do not divide by world size %d" % (name, shape[0], world))
    actor = os.path.join(args.out, "actor")
    os.makedirs(actor)
    ns = V.TORCH_24
    mesh = ns.DeviceMesh("cuda", torch.arange(world), ("fsdp",))
    placements = (ns.Shard(0),)
    g = torch.Generator().manual_seed(args.seed)
    total = 0
    for rank in range(world):
        local = collections.OrderedDict()
        for name, shape in shapes:
            meta = ns.TensorMeta(torch.Size(shape), V.row_major_stride(shape), torch.float32)
            rows = (shape[0] // world,) + tuple(shape[1:])
            shard = torch.randn(*rows, generator=g) * 0.02
            local[name] = ns.DTensor(shard, ns.DTensorSpec(mesh, placements, meta), rank)
            total += shard.numel() * 4
        torch.save(local, os.path.join(actor, "model_world_size_%d_rank_%d.pt" % (world, rank)))
        del local
    with open(os.path.join(actor, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world}, f)
    os.makedirs(os.path.join(actor, "huggingface"))
    with open(os.path.join(actor, "huggingface", "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": args.hidden, "intermediate_size": args.ffn,
                   "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
                   "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
                   "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                   "torch_dtype": "float32"}, f, indent=2)
    print(json.dumps({"total_size": total, "files": world, "tensors": len(shapes),
                      "world_size": world, "hidden_size": args.hidden,
                      "num_hidden_layers": args.layers, "intermediate_size": args.ffn,
                      "vocab_size": args.vocab}))


if __name__ == "__main__":
    main()
