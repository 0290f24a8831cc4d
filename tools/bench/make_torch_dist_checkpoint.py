#!/usr/bin/python3
"""Write a synthetic Megatron-Core torch_dist checkpoint (a GPT model, layer-stacked) of a
requested size.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_torch_dist_checkpoint.py --size 4GiB --tp 2 SAVE_DIR

Writes SAVE_DIR/latest_checkpointed_iteration.txt and SAVE_DIR/iter_0000010/ with the DCP files
of TP ranks (`__R_0.distcp`: one torch.save archive per chunk, each chunk one layer's
tensor-parallel shard of a layer-stacked `decoder.layers.*` tensor, replicated tensors stored
by rank 0), `.metadata` and `metadata.json`, as tests/fixtures/torch_dist_fixture.py lays them
out (its tensor list and the DCP metadata classes of tests/fixtures/dcp_fixture.py), but
streamed: one chunk in memory at a time. F32, hidden size chosen so that the tensor data is
about SIZE (24 layers, vocabulary 32000, ffn 4 x hidden). Prints a JSON summary on stdout.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
import make_checkpoint as mc  # noqa: E402

import torch  # noqa: E402
import dcp_fixture as F  # noqa: E402
import torch_dist_fixture as M  # noqa: E402


def choose_hidden(total_bytes, layers, vocab, tp):
    # 12 h^2 + 13 h per layer (qkv, proj, fc1, fc2 and their biases and norms), 2 V h + 2 h else.
    per_param = 4
    h = 128
    while True:
        nxt = h + 128
        params = layers * (12 * nxt * nxt + 13 * nxt) + 2 * vocab * nxt + 2 * nxt
        if params * per_param > total_bytes:
            return h
        h = nxt


def write(out, hidden, ffn, layers=24, vocab=32000, tp=2, seed=0, prefix=""):
    """Writes the checkpoint under `out` (keys with `prefix`); returns the JSON summary."""
    vocab -= vocab % tp
    folder = M.iteration_folder(out)
    os.makedirs(folder)
    g = torch.Generator().manual_seed(seed)

    # (key, global shape, {dim: parts}, rank of a grid index)
    specs = [("embedding.word_embeddings.weight", (vocab, hidden), {0: tp}, lambda i: i[0])]
    for name, shape_of, tp_dim in M.LAYER_TENSORS:
        shape = (layers,) + shape_of(hidden, ffn)
        if tp_dim is None:
            specs.append(("decoder.layers." + name, shape, {0: layers}, lambda i: 0))
        else:
            specs.append(("decoder.layers." + name, shape, {0: layers, tp_dim + 1: tp},
                          lambda i, d=tp_dim + 1: i[d]))
    specs += [("decoder.final_layernorm.weight", (hidden,), {}, lambda i: 0),
              ("decoder.final_layernorm.bias", (hidden,), {}, lambda i: 0),
              ("output_layer.weight", (vocab, hidden), {0: tp}, lambda i: i[0])]
    specs = [(prefix + key, shape, splits, rank_of) for key, shape, splits, rank_of in specs]

    F._use_metadata_class("new")
    streams = [open(os.path.join(folder, "__%d_0.distcp" % r), "wb") for r in range(tp)]
    md, storage_data, total = {}, {}, 0
    for key, shape, splits, rank_of in specs:
        chunks = []
        for index, (rank, offsets, sizes) in enumerate(F.Grid(splits, rank_of).boxes(shape)):
            chunk = torch.randn(*sizes, generator=g) * 0.02
            stream = streams[rank]
            offset = stream.tell()
            torch.save(chunk, stream)
            storage_data[F.MetadataIndex(key, offsets, index)] = F.StorageInfo(
                "__%d_0.distcp" % rank, offset, stream.tell() - offset)
            chunks.append(F.ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            total += chunk.numel() * 4
        md[key] = F.TensorStorageMetadata(F.TensorPropertiesNew(dtype=torch.float32),
                                          torch.Size(shape), chunks)
    for stream in streams:
        stream.close()
    F.write_metadata(folder, F.MetadataNew(state_dict_metadata=md, planner_data=None,
                                           storage_data=storage_data, version="1.0.0"))
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("%d" % M.ITERATION)
    return {"total_size": total, "files": tp + 2, "tensors": len(md),
            "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
            "vocab_size": vocab, "tp": tp}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="save folder to create; must not exist")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"))
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    hidden = choose_hidden(args.size, args.layers, args.vocab, args.tp)
    summary = write(args.out, hidden, 4 * hidden, args.layers, args.vocab, args.tp, args.seed)
    print(json.dumps(summary))
    if not args.quiet:
        sys.stderr.write("wrote %s: %d bytes of tensor data\n" % (args.out, summary["total_size"]))


if __name__ == "__main__":
    main()
