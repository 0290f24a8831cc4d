"""Writes seeds for the OLMo key fuzzer (entry names as olmo/safetensors_util.py's encode_key
writes them: base64.urlsafe_b64encode(pickle.dumps((keys, value_is_pickled)))) and for the
ColossalAI metadata fuzzer (metadata files as PR #6181's save_metadata writes them).

Usage: make_key_meta_seeds.py OLMO_SEED_DIR COLOSSALAI_SEED_DIR   (run with /usr/bin/python3)
"""
import base64
import json
import os
import pickle
import sys


def main(olmo_dir, colossal_dir):
    os.makedirs(olmo_dir, exist_ok=True)
    os.makedirs(colossal_dir, exist_ok=True)
    keys = [(("transformer.wte.weight",), False), (("optim", "state", 0, "exp_avg"), False),
            (("optim", "param_groups"), True), (("a", 300, -5, 2**40, 70000), False),
            (("x" * 300,), True)]
    for i, key in enumerate(keys):
        for protocol in (2, 4):
            name = base64.urlsafe_b64encode(pickle.dumps(key, protocol=protocol))
            with open(os.path.join(olmo_dir, "key-%d-p%d" % (i, protocol)), "wb") as f:
                f.write(name)
    for tp_rank in range(2):
        meta = {}
        for name, shape, dim in (("embed.weight", [50, 16], 0), ("out.weight", [16, 16], 1),
                                 ("norm.weight", [16], None)):
            offsets, lengths = [0] * len(shape), list(shape)
            if dim is not None:
                local = (shape[dim] + 1) // 2
                offsets[dim] = local * tp_rank
                lengths[dim] = local if tp_rank == 0 else shape[dim] - local
            meta[name] = {"offsets": offsets, "lengths": lengths, "global_shape": shape,
                          "file": "/ckpt/pytorch_model-dist-%05d.bin" % tp_rank,
                          "rank": tp_rank}
        doc = {"checkpoint_version": "1.0", "total_size": None, "metadata": meta}
        with open(os.path.join(colossal_dir, "meta-%d.json" % tp_rank), "w") as f:
            json.dump(doc, f, indent=4)
    # An uneven split leaves the last of three ranks no rows: a box with a zero length, which
    # covers nothing (a crash the fuzzer found once, in its own invariant check).
    doc = {"checkpoint_version": "1.0", "total_size": None,
           "metadata": {"tiny.weight": {"offsets": [2, 0], "lengths": [0, 16],
                                        "global_shape": [2, 16],
                                        "file": "/ckpt/pytorch_model-dist-00002.bin",
                                        "rank": 2}}}
    with open(os.path.join(colossal_dir, "meta-empty.json"), "w") as f:
        json.dump(doc, f, indent=4)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
