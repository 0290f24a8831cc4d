"""Writes a seed corpus of valid and near-valid safetensors files for the header fuzzer."""
import json
import os
import struct
import sys


def encode(header, data=b""):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    seeds = {
        "empty": encode({}),
        "meta": encode({"__metadata__": {"format": "pt"}}),
        "one": encode({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, bytes(16)),
        "scalar_and_empty": encode({
            "s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
            "e": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [8, 8]},
            "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [8, 11]},
        }, bytes(11)),
        "gap": encode({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, bytes(3)),
        "dtypes": encode({d: {"dtype": d, "shape": [1], "data_offsets": [0, 0]}
                          for d in ["F8_E4M3"]}, b""),
    }
    for name, blob in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main(sys.argv[1])
