#!/usr/bin/python3
"""Write a synthetic NeMo 1 `.nemo` archive whose weights are a `model_weights/` Megatron-Core
torch_dist folder, the input of the NeMo consolidation benchmark.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_nemo_checkpoint.py --tp 2 MODEL.nemo

The archive holds ./model_config.yaml and the tokenizer file as tests/fixtures/nemo_fixture.py
writes them, and ./model_weights/ (`__R_0.distcp` per TP rank, `.metadata`, `metadata.json`,
keys with `model.`) written by make_torch_dist_checkpoint.py one chunk at a time into a staging
folder beside MODEL.nemo; each member is deleted as soon as it is in the archive, so the disk
holds the weights about once. F32, the GPT tensors of tests/fixtures/torch_dist_fixture.py
(layer-stacked); defaults: hidden 2048, 24 layers, 16 heads, ffn 5632, vocabulary 32000
(4.36 GB of tensor data). Prints a JSON summary.
"""

import argparse
import json
import os
import shutil
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
sys.dont_write_bytecode = True

import make_torch_dist_checkpoint as mtd  # noqa: E402
import nemo_fixture as NF  # noqa: E402
import torch_dist_fixture as TD  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help=".nemo archive to create; must not exist")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if os.path.exists(args.out):
        sys.exit("%s exists" % args.out)
    staging = args.out + ".staging"
    os.makedirs(staging)
    try:
        save = os.path.join(staging, "save")
        summary = mtd.write(save, args.hidden, args.ffn, args.layers, args.vocab, args.tp,
                            args.seed, prefix="model.")
        weights = TD.iteration_folder(save)
        members = os.path.join(staging, "members")
        os.makedirs(members)
        config = os.path.join(members, "model_config.yaml")
        with open(config, "w") as f:
            f.write(NF.config_yaml(args.tp, 1, args.layers, args.hidden, args.ffn, args.heads))
        tokenizer = os.path.join(members, NF.TOKENIZER_HASH + "_tokenizer.model")
        with open(tokenizer, "wb") as f:
            f.write(b"\x0a\x05hello")
        with tarfile.open(args.out, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(members, arcname=".", recursive=False)
            for path in (config, tokenizer):
                tar.add(path, arcname="./" + os.path.basename(path))
            tar.add(weights, arcname="./model_weights", recursive=False)
            for name in sorted(os.listdir(weights)):
                path = os.path.join(weights, name)
                tar.add(path, arcname="./model_weights/" + name)
                os.remove(path)
    finally:
        shutil.rmtree(staging)
    summary["archive_size"] = os.path.getsize(args.out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
