#!/usr/bin/python3
"""Write a synthetic Llama-like PyTorch checkpoint (one torch.save file) of a requested size.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_torch_checkpoint.py --size 4GiB OUT.pt

Same model shapes and names as make_checkpoint.py (embed_tokens, per-layer q/k/v/o_proj,
gate/up/down_proj, the two layer norms, the final norm, lm_head; F32), saved as a flat
OrderedDict with torch.save (zip format, as every torch >= 1.6 writes it). The data is one
random block (64 MiB by default) of normal(0, 0.02) floats tiled into every tensor from a
per-tensor offset. torch.save needs every tensor in memory at once: peak memory is about the
checkpoint size plus one block (4GiB: ~4.2 GiB). Prints a JSON summary on stdout.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output file (e.g. model.pt); must not exist")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"),
                    help="total tensor data size, e.g. 4GiB, 256MiB (default 4GiB)")
    ap.add_argument("--hidden", type=int, help="force the hidden size")
    ap.add_argument("--layers", type=int, help="force the layer count")
    ap.add_argument("--vocab", type=int, help="force the vocabulary size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=mc.parse_size, default=mc.parse_size("64MiB"),
                    help="size of the random block tiled into tensors (default 64MiB)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    if os.path.exists(args.out):
        raise SystemExit(f"{args.out} already exists; refusing to overwrite")
    hidden, inter, layers, vocab = mc.choose_config(args.size, args.hidden, args.layers,
                                                    args.vocab)
    tensors = mc.model_tensors(hidden, inter, layers, vocab)
    total = sum(mc.nbytes(s) for _, s in tensors)

    t0 = time.monotonic()
    g = torch.Generator().manual_seed(args.seed)
    block_elems = max(1, args.block_size // mc.F32)
    block = torch.randn(block_elems, generator=g) * 0.02

    sd = collections.OrderedDict()
    for name, shape in tensors:
        t = torch.empty(shape, dtype=torch.float32)
        flat = t.view(-1)
        n = flat.numel()
        pos = zlib.crc32(name.encode()) % block_elems
        done = 0
        while done < n:
            k = min(n - done, block_elems - pos)
            flat[done:done + k].copy_(block[pos:pos + k])
            done += k
            pos = 0
        sd[name] = t
    if not args.quiet:
        print(f"  built {len(sd)} tensors, {total} bytes; saving {args.out}", file=sys.stderr)
    tmp = args.out + ".partial"
    torch.save(sd, tmp)
    os.replace(tmp, args.out)

    summary = {
        "path": args.out, "format": "torch", "total_size": total, "requested_size": args.size,
        "files": 1, "file_bytes": os.path.getsize(args.out), "tensors": len(tensors),
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "vocab_size": vocab, "seconds": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
