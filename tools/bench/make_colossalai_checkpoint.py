#!/usr/bin/python3
"""Write a synthetic ColossalAI distributed checkpoint (PR #6181) of a requested size.

Run with /usr/bin/python3 (numpy only). Example:

    /usr/bin/python3 tools/bench/make_colossalai_checkpoint.py --size 4GiB --tp 4 OUT_DIR

OUT_DIR gets, for each tensor-parallel rank R (dist_id = R, one pipeline stage), the unsharded
safetensors layout of `booster.save_model(..., gather_dtensor=False, use_async=True)`:
`pytorch_model-dist-{R:05d}.safetensors` with the rank's local tensors and
`pytorch_model-meta-dist-{R:05d}.index.json` with `offsets`, `lengths`, `global_shape`, `file`
(the saving machine's absolute path, as unsharded saves record it) and `rank` per parameter,
computed as the PR's create_model_metadata does. The model is make_checkpoint.py's Llama-like
F32 decoder: embed_tokens, lm_head, q/k/v, gate/up split along dim 0, o/down along dim 1 (the
local size is ceil(global / tp); the last rank's `lengths` leave its padding out), norms
replicated in every rank's file. Data is make_checkpoint.py's tiled random block, so memory
stays at about one block. Prints a JSON summary on stdout (`total_size` = the global model's
data bytes; `bytes_on_disk` counts the replicas and padding).
"""

import argparse
import json
import os
import struct
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_checkpoint as mc  # noqa: E402

SAVING_MACHINE = "/mnt/cluster/colossalai-run/checkpoint"


def split_dim(name):
    if any(k in name for k in ("embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj",
                               "gate_proj", "up_proj")):
        return 0
    if "o_proj" in name or "down_proj" in name:
        return 1
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (created; must not contain a checkpoint)")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"),
                    help="global model data size, e.g. 4GiB (default 4GiB)")
    ap.add_argument("--tp", type=int, default=4, help="tensor-parallel ranks (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=mc.parse_size, default=mc.parse_size("64MiB"))
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    hidden, inter, layers, vocab = mc.choose_config(args.size)
    tensors = mc.model_tensors(hidden, inter, layers, vocab)
    total = sum(mc.nbytes(s) for _, s in tensors)
    os.makedirs(args.out, exist_ok=True)
    if any(x.startswith("pytorch_model-") for x in os.listdir(args.out)):
        raise SystemExit(f"{args.out} already holds a checkpoint; refusing to mix them")

    t0 = time.monotonic()
    rng = np.random.default_rng(args.seed)
    block = rng.standard_normal(max(1, args.block_size // mc.F32), dtype=np.float32)
    block *= np.float32(0.02)
    block_view = memoryview(block.astype("<f4", copy=False)).cast("B")

    on_disk = 0
    for rank in range(args.tp):
        local, meta = [], {}
        for name, shape in tensors:
            dim = split_dim(name)
            entry = {"offsets": [0] * len(shape), "lengths": list(shape), "global_shape": shape}
            shape_local = list(shape)
            if dim is not None:
                size = -(-shape[dim] // args.tp)  # padded to a multiple of tp, then chunked
                shape_local[dim] = size
                entry["offsets"][dim] = size * rank
                entry["lengths"][dim] = size if rank < args.tp - 1 else shape[dim] - size * rank
            local.append((name, shape_local))
            meta[name] = entry
        fname = "pytorch_model-dist-%05d.safetensors" % rank
        for entry in meta.values():
            entry["file"] = os.path.join(SAVING_MACHINE, fname)
            entry["rank"] = rank
        header, ordered, data_bytes = mc.build_header(local)
        with open(os.path.join(args.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for name, shape in ordered:
                start = (zlib.crc32(("%s/%d" % (name, rank)).encode()) * mc.F32) % len(block_view)
                mc.write_tiled(f, block_view, start, mc.nbytes(shape))
        on_disk += 8 + len(header) + data_bytes
        doc = {"checkpoint_version": "1.0", "total_size": data_bytes, "metadata": meta}
        with open(os.path.join(args.out, "pytorch_model-meta-dist-%05d.index.json" % rank),
                  "w") as f:
            json.dump(doc, f, indent=4)
        if not args.quiet:
            print(f"  wrote {fname}: {len(local)} tensors, {data_bytes} data bytes",
                  file=sys.stderr)

    print(json.dumps({
        "path": args.out, "total_size": total, "requested_size": args.size, "files": args.tp,
        "tensors": len(tensors), "tp": args.tp, "bytes_on_disk": on_disk,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "vocab_size": vocab, "seconds": round(time.monotonic() - t0, 2),
    }))


if __name__ == "__main__":
    main()
