#!/usr/bin/python3
"""Write a synthetic Hugging Face sharded safetensors checkpoint of a requested size.

Run with /usr/bin/python3 (numpy only). Example:

    /usr/bin/python3 tools/bench/make_checkpoint.py --size 4GiB OUT_DIR

Produces OUT_DIR/model-0000i-of-0000N.safetensors + OUT_DIR/model.safetensors.index.json with
Llama-like F32 tensors (embed_tokens, per-layer q/k/v/o_proj, gate/up/down_proj, the two layer
norms, the final norm and lm_head). The hidden size and layer count are chosen so that the data
bytes land near the requested size; the vocabulary absorbs the remainder so the total is within
a few KiB of it.

File layout follows the reference writer: 8-byte little-endian header length, compact JSON header
padded with spaces to a multiple of 8, `__metadata__` = {"format": "pt"} first, tensors ordered
by dtype descending then name, data contiguous in that order. Shards are split with Hugging
Face's rule (huggingface_hub's split_state_dict_into_shards: tensors in model order; a tensor
larger than the limit goes alone in its own file; otherwise a new file starts when the current
one would exceed the limit). The limit defaults to a quarter of --size, so about 5 files. The index is written
like transformers does (indent 2, sorted keys, `metadata.total_size` = data bytes).

Data: one random block (64 MiB by default) of normal(0, 0.02) F32 values, generated once and
tiled into every tensor from a per-tensor offset, written in block-sized chunks, so memory stays
at about one block whatever the model size.
"""

import argparse
import json
import os
import re
import struct
import sys
import time
import zlib

import numpy as np

F32 = 4
UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r} (use e.g. 4GiB, 512MiB, 5GB or plain bytes)")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def round_up(x, m):
    return (x + m - 1) // m * m


# Llama-like hidden sizes to choose from (the largest that still gives >= MIN_LAYERS layers wins).
HIDDEN_CANDIDATES = [256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6656, 8192]
MIN_LAYERS = 12
BASE_VOCAB = 32000
MAX_EMBED_FRACTION = 0.2  # embed_tokens + lm_head at most this share of the total


def intermediate_for(hidden):
    return round_up(hidden * 8 // 3, 256)


def layer_elems(hidden, inter):
    # q, k, v, o (no GQA) + gate, up, down + two norms
    return 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden


def choose_config(total_bytes, hidden=None, layers=None, vocab=None):
    """Returns (hidden, intermediate, layers, vocab) with data bytes close to total_bytes."""
    target = total_bytes // F32  # elements
    candidates = [hidden] if hidden else HIDDEN_CANDIDATES
    best = None
    for h in candidates:
        inter = intermediate_for(h)
        per_layer = layer_elems(h, inter)
        base_vocab = vocab or max(256, min(BASE_VOCAB, int(target * MAX_EMBED_FRACTION) // (2 * h)))
        fixed = 2 * base_vocab * h + h  # embed_tokens + lm_head + final norm
        n_layers = layers or (target - fixed) // per_layer
        if n_layers < 1:
            continue
        cfg = (h, inter, n_layers, base_vocab)
        if hidden or layers or n_layers >= MIN_LAYERS or best is None:
            best = cfg
        if n_layers < MIN_LAYERS and not (hidden or layers):
            break
    if best is None:
        raise SystemExit(f"size {total_bytes} bytes is too small for even one layer")
    h, inter, n_layers, v = best
    if not vocab:
        # Let the vocabulary absorb what the whole layers leave over.
        rest = target - (n_layers * layer_elems(h, inter) + 2 * v * h + h)
        if rest > 0:
            v += rest // (2 * h)
    return h, inter, n_layers, v


def model_tensors(hidden, inter, layers, vocab):
    """(name, shape) in Hugging Face state_dict order."""
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", [hidden, hidden]),
            (p + "self_attn.k_proj.weight", [hidden, hidden]),
            (p + "self_attn.v_proj.weight", [hidden, hidden]),
            (p + "self_attn.o_proj.weight", [hidden, hidden]),
            (p + "mlp.gate_proj.weight", [inter, hidden]),
            (p + "mlp.up_proj.weight", [inter, hidden]),
            (p + "mlp.down_proj.weight", [hidden, inter]),
            (p + "input_layernorm.weight", [hidden]),
            (p + "post_attention_layernorm.weight", [hidden]),
        ]
    out += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    return out


def nbytes(shape):
    n = F32
    for d in shape:
        n *= d
    return n


def split_shards(tensors, max_shard):
    """Hugging Face's split_state_dict_into_shards rule; returns a list of lists of (name, shape).

    Tensors in model order; a tensor larger than the limit is put alone in its own shard (the
    current shard carries on after it); otherwise a new shard starts when adding the tensor would
    push the current one over the limit."""
    shards, cur, cur_bytes = [], [], 0
    for name, shape in tensors:
        size = nbytes(shape)
        if size > max_shard:
            shards.append([(name, shape)])
            continue
        if cur and cur_bytes + size > max_shard:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, shape))
        cur_bytes += size
    if cur:
        shards.append(cur)
    return shards


def build_header(tensors):
    """tensors: list of (name, shape), all F32. Returns (padded header bytes, ordered tensors)."""
    ordered = sorted(tensors, key=lambda t: t[0])  # one dtype: dtype desc then name == name
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in ordered:
        size = nbytes(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (round_up(len(raw), 8) - len(raw))
    return raw, ordered, offset


def write_tiled(f, block_view, start, count):
    """Writes count bytes of block_view tiled, starting at byte start of the block."""
    block_len = len(block_view)
    pos = start % block_len
    while count > 0:
        n = min(count, block_len - pos)
        f.write(block_view[pos:pos + n])
        count -= n
        pos = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (created; must not contain a checkpoint)")
    ap.add_argument("--size", type=parse_size, default=parse_size("4GiB"),
                    help="total tensor data size, e.g. 4GiB, 256MiB, 2GB (default 4GiB)")
    ap.add_argument("--max-shard-size", type=parse_size, default=None,
                    help="shard limit (default: a quarter of --size, so about 4-5 files)")
    ap.add_argument("--hidden", type=int, help="force the hidden size")
    ap.add_argument("--layers", type=int, help="force the layer count")
    ap.add_argument("--vocab", type=int, help="force the vocabulary size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=parse_size, default=parse_size("64MiB"),
                    help="size of the random block tiled into tensors (default 64MiB)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    hidden, inter, layers, vocab = choose_config(args.size, args.hidden, args.layers, args.vocab)
    tensors = model_tensors(hidden, inter, layers, vocab)
    total = sum(nbytes(s) for _, s in tensors)
    max_shard = args.max_shard_size or max(1, args.size // 4)
    shards = split_shards(tensors, max_shard)
    n = len(shards)

    os.makedirs(args.out, exist_ok=True)
    existing = [x for x in os.listdir(args.out) if x.endswith(".safetensors") or x.endswith(".json")]
    if existing:
        raise SystemExit(f"{args.out} already holds {existing[0]}; refusing to mix checkpoints")

    t0 = time.monotonic()
    rng = np.random.default_rng(args.seed)
    block_elems = max(1, args.block_size // F32)
    block = rng.standard_normal(block_elems, dtype=np.float32)
    block *= np.float32(0.02)
    block = block.astype("<f4", copy=False)  # little-endian on any host
    block_view = memoryview(block).cast("B")

    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        header, ordered, data_bytes = build_header(shard)
        path = os.path.join(args.out, fname)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for name, shape in ordered:
                start = (zlib.crc32(name.encode()) * F32) % len(block_view)
                write_tiled(f, block_view, start, nbytes(shape))
                weight_map[name] = fname
        if not args.quiet:
            print(f"  wrote {fname}: {len(shard)} tensors, {data_bytes} data bytes",
                  file=sys.stderr)

    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")

    summary = {
        "path": args.out, "total_size": total, "requested_size": args.size, "files": n,
        "tensors": len(tensors), "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "vocab_size": vocab, "max_shard_size": max_shard,
        "seconds": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
