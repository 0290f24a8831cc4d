#!/usr/bin/python3
"""Write a synthetic metaseq (OPT) model-parallel checkpoint of a requested size.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_metaseq_checkpoint.py --size 4GiB --parts 2 OUT_DIR

OUT_DIR gets `reshard-model_part-<rank>.pt` for each of --parts ranks, as metaseq's
scripts/reshard_mp.py writes them: each a torch.save (zip format) of {"model": state_dict,
"cfg": ..., "optimizer_history": ..., "extra_state": ...}. The state_dict is the rank's slice of
an OPT-like F32 decoder (tests/torch_writer_test.py's MetaseqTests layout): `qkv_proj` stacks
the rank's q, k and v rows (`"fused": 3` in `--rules metaseq`), `embed_tokens` and `fc1` are split
along dim 0, `out_proj.weight` and `fc2.weight` along dim 1, the rest (positions, layer norms,
biases of out_proj/fc2, version) is replicated in every part.

--size is the data bytes of the whole (unsplit) model; the replicated tensors are stored once
per part, so the folder is slightly larger. The hidden size is the largest that still gives at
least 12 layers with the embeddings at most ~20% of the model; the vocabulary (a multiple of
8, so 2, 4 and 8 parts divide it) absorbs the rest. Data is one random block (64 MiB by default)
of normal(0, 0.02) floats tiled into every tensor. One part is built and saved at a time: peak
memory is about SIZE / parts plus the block. Prints a JSON summary on stdout.
"""

import argparse
import collections
import json
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint as mc  # noqa: E402

import torch  # noqa: E402

HIDDEN_CANDIDATES = [256, 512, 768, 1024, 1536, 2048, 2560, 4096, 5120, 7168, 9216, 12288]
MIN_LAYERS = 12
BASE_VOCAB = 50272  # OPT's
POSITIONS = 2048 + 2  # learned positions, with metaseq's offset of 2
MAX_EMBED_FRACTION = 0.2


def layer_elems(h):
    # qkv (3h x h + 3h), out_proj (h x h + h), fc1 (4h x h + 4h), fc2 (h x 4h + h), 2 layer norms
    return 12 * h * h + 13 * h


def choose_config(total_bytes, parts):
    """(hidden, layers, vocab) with the full model's data bytes close to total_bytes."""
    target = total_bytes // mc.F32
    best = None
    for h in HIDDEN_CANDIDATES:
        if h % parts:
            continue
        vocab = max(256, min(BASE_VOCAB, int(target * MAX_EMBED_FRACTION) // h)) // 8 * 8
        fixed = vocab * h + POSITIONS * h + 2 * h + 1
        layers = (target - fixed) // layer_elems(h)
        if layers < 1:
            continue
        if layers >= MIN_LAYERS or best is None:
            best = (h, layers, vocab)
        if layers < MIN_LAYERS:
            break
    if best is None:
        raise SystemExit(f"size {total_bytes} bytes is too small for even one layer")
    h, layers, vocab = best
    rest = target - (layers * layer_elems(h) + vocab * h + POSITIONS * h + 2 * h + 1)
    if rest > 0:
        vocab += rest // h // 8 * 8
    return h, layers, vocab


def part_shapes(h, layers, vocab, n):
    """(name, shape of one part) in metaseq's state_dict order."""
    f = 4 * h
    out = [("decoder.version", [1]),
           ("decoder.embed_tokens.weight", [vocab // n, h]),
           ("decoder.embed_positions.weight", [POSITIONS, h])]
    for i in range(layers):
        p = "decoder.layers.%d." % i
        out += [
            (p + "self_attn.qkv_proj.weight", [3 * h // n, h]),
            (p + "self_attn.qkv_proj.bias", [3 * h // n]),
            (p + "self_attn.out_proj.weight", [h, h // n]),
            (p + "self_attn.out_proj.bias", [h]),
            (p + "self_attn_layer_norm.weight", [h]),
            (p + "self_attn_layer_norm.bias", [h]),
            (p + "fc1.weight", [f // n, h]),
            (p + "fc1.bias", [f // n]),
            (p + "fc2.weight", [h, f // n]),
            (p + "fc2.bias", [h]),
            (p + "final_layer_norm.weight", [h]),
            (p + "final_layer_norm.bias", [h]),
        ]
    out += [("decoder.layer_norm.weight", [h]), ("decoder.layer_norm.bias", [h])]
    return out


def is_split(name):
    """Split across the parts by metaseq's rules (the rest is replicated)."""
    return ("qkv_proj" in name or "embed_tokens" in name or ".fc1." in name
            or name.endswith("fc2.weight") or name.endswith("out_proj.weight"))


def extras(rank, n, h):
    return {
        "cfg": {"model": {"_name": "transformer_lm_megatron", "decoder_embed_dim": h,
                          "dropout": 0.1, "share_decoder_input_output_embed": True},
                "distributed_training": {"distributed_world_size": n, "model_parallel_size": n},
                "common": {"fp16": False}},
        "optimizer_history": [{"criterion_name": "VocabParallelCrossEntropyCriterion",
                               "optimizer_name": "MemoryEfficientFP16Adam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 100}],
        "extra_state": {"epoch": 1, "val_loss": 2.5, "rank": rank},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder; must not exist")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"),
                    help="data bytes of the whole model, e.g. 4GiB, 256MiB (default 4GiB)")
    ap.add_argument("--parts", type=int, default=2, help="model-parallel parts (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=mc.parse_size, default=mc.parse_size("64MiB"),
                    help="size of the random block tiled into tensors (default 64MiB)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if os.path.exists(args.out):
        raise SystemExit(f"{args.out} already exists; refusing to overwrite")
    if args.parts < 1:
        ap.error("--parts must be >= 1")

    h, layers, vocab = choose_config(args.size, args.parts)
    shapes = part_shapes(h, layers, vocab, args.parts)
    t0 = time.monotonic()
    g = torch.Generator().manual_seed(args.seed)
    block_elems = max(1, args.block_size // mc.F32)
    block = torch.randn(block_elems, generator=g) * 0.02

    os.makedirs(args.out)
    total = 0         # data bytes of the whole model (replicated tensors counted once)
    replicated = {}   # part 0's replicated tensors, shared by every part
    for rank in range(args.parts):
        sd = collections.OrderedDict()
        for name, shape in shapes:
            split = is_split(name)
            if not split and name in replicated:
                sd[name] = replicated[name]
                continue
            if name == "decoder.version":
                t = torch.Tensor([3])
            else:
                t = torch.empty(shape, dtype=torch.float32)
                flat = t.view(-1)
                n = flat.numel()
                pos = zlib.crc32(("%s/%d" % (name, rank)).encode()) % block_elems
                done = 0
                while done < n:
                    k = min(n - done, block_elems - pos)
                    flat[done:done + k].copy_(block[pos:pos + k])
                    done += k
                    pos = 0
            if not split:
                replicated[name] = t
            total += t.numel() * t.element_size()
            sd[name] = t
        ckpt = {"model": sd}
        ckpt.update(extras(rank, args.parts, h))
        path = os.path.join(args.out, "reshard-model_part-%d.pt" % rank)
        if not args.quiet:
            print(f"  saving {path}", file=sys.stderr)
        torch.save(ckpt, path + ".partial")
        os.replace(path + ".partial", path)
        del ckpt, sd
    files = [os.path.join(args.out, f) for f in sorted(os.listdir(args.out))]
    summary = {
        "path": args.out, "format": "metaseq", "total_size": total,
        "requested_size": args.size, "parts": args.parts, "files": len(files),
        "tensors": len(shapes), "hidden_size": h, "intermediate_size": 4 * h,
        "num_hidden_layers": layers, "vocab_size": vocab,
        "bytes_on_disk": sum(os.path.getsize(f) for f in files),
        "seconds": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
