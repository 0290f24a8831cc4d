#!/usr/bin/python3
"""Independent check of a sharded safetensors checkpoint folder (stdlib + numpy only).

    /usr/bin/python3 tools/bench/check_checkpoint.py DIR [--data] [--parts]

Checks every *.safetensors file in DIR against the format rules the reference writer follows:
8-byte little-endian header length; header JSON padded with spaces to a multiple of 8;
`__metadata__` = {"format": "pt"} (extra string keys allowed); tensors ordered by dtype
descending then name, with contiguous data_offsets from 0 covering exactly the data section;
file size = 8 + header + data. If DIR has model.safetensors.index.json, its weight_map must name
every tensor in the right file and its metadata.total_size must equal the data bytes. With
--parts, DIR holds model-parallel parts (`reshard --parts M` output, model_part-<i>.safetensors):
every file must hold the same tensor names instead of disjoint ones. With
--data, also reads every tensor with numpy and checks the float data is finite. Exits 0 and
prints a one-line summary when all holds, else prints the first problem and exits 1.
"""

import json
import os
import struct
import sys

import numpy as np

# The reference (Rust) writer's Dtype enum in increasing order, with bits per element;
# "dtype descending" in the file order means the reverse of this list.
DTYPE_BITS = [("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8),
              ("F8_E5M2", 8), ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8),
              ("F8_E5M2FNUZ", 8), ("I16", 16), ("U16", 16), ("F16", 16), ("BF16", 16),
              ("I32", 32), ("U32", 32), ("F32", 32), ("C64", 64), ("F64", 64), ("I64", 64),
              ("U64", 64)]
DTYPE_ORDER = [d for d, _ in DTYPE_BITS]
BITS = dict(DTYPE_BITS)
NUMPY = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


def fail(msg):
    print(f"check_checkpoint: FAIL: {msg}")
    sys.exit(1)


def check_file(path, check_data):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            fail(f"{path}: shorter than 8 bytes")
        (hlen,) = struct.unpack("<Q", raw)
        if hlen % 8:
            fail(f"{path}: header length {hlen} not a multiple of 8")
        if 8 + hlen > size:
            fail(f"{path}: header length {hlen} beyond file size {size}")
        hraw = f.read(hlen)
    text = hraw.decode("utf-8")
    stripped = text.rstrip(" ")
    if len(text) - len(stripped) >= 8:
        fail(f"{path}: more than 7 padding spaces")
    if not stripped.startswith("{") or not stripped.endswith("}"):
        fail(f"{path}: header is not a JSON object padded with spaces")
    def no_duplicates(pairs):
        d = dict(pairs)
        if len(d) != len(pairs):
            fail(f"{path}: duplicate keys in header")
        return d
    header = json.loads(stripped, object_pairs_hook=no_duplicates)
    meta = header.pop("__metadata__", None)
    if meta is None or meta.get("format") != "pt":
        fail(f"{path}: __metadata__ missing or format != pt: {meta!r}")
    if not all(isinstance(v, str) for v in meta.values()):
        fail(f"{path}: __metadata__ values must be strings")
    # Order by data offset must equal (dtype desc, name).
    by_offset = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    expected = sorted(header.items(),
                      key=lambda kv: (-DTYPE_ORDER.index(kv[1]["dtype"]), kv[0]))
    if [k for k, _ in by_offset] != [k for k, _ in expected]:
        fail(f"{path}: tensors not ordered by dtype descending then name")
    pos = 0
    for name, info in by_offset:
        begin, end = info["data_offsets"]
        if info["dtype"] not in BITS:
            fail(f"{path}: tensor {name}: unknown dtype {info['dtype']!r}")
        n = BITS[info["dtype"]]
        for d in info["shape"]:
            n *= d
        if n % 8:
            fail(f"{path}: tensor {name}: {n} bits is not a whole number of bytes")
        n //= 8
        if begin != pos or end - begin != n:
            fail(f"{path}: tensor {name} offsets {begin}..{end}, expected {pos}..{pos + n}")
        pos = end
    if 8 + hlen + pos != size:
        fail(f"{path}: file size {size} != 8 + {hlen} + {pos}")
    if check_data:
        for name, info in by_offset:
            dt = NUMPY.get(info["dtype"])
            if not dt:
                continue
            begin, end = info["data_offsets"]
            arr = np.memmap(path, dtype=dt, mode="r", offset=8 + hlen + begin,
                            shape=((end - begin) // np.dtype(dt).itemsize,))
            if arr.size and not np.isfinite(arr).all():
                fail(f"{path}: tensor {name} has non-finite values")
            del arr
    return {k: v for k, v in header.items()}, pos


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    check_data = "--data" in sys.argv[1:]
    parts = "--parts" in sys.argv[1:]
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    folder = args[0]
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        fail(f"{folder}: no .safetensors files")
    where, total, ntensors = {}, 0, 0
    first_names = None
    for fname in files:
        tensors, data = check_file(os.path.join(folder, fname), check_data)
        total += data
        ntensors += len(tensors)
        if parts:
            names = set(tensors)
            if first_names is None:
                first_names = names
            elif names != first_names:
                fail(f"{fname}: tensor names differ from {files[0]}'s "
                     f"(e.g. {sorted(names ^ first_names)[:3]})")
            continue
        for name in tensors:
            if name in where:
                fail(f"tensor {name} in both {where[name]} and {fname}")
            where[name] = fname
    if parts and sorted(files) != sorted(f"model_part-{i}.safetensors" for i in range(len(files))):
        fail(f"unexpected part names {files[:5]}")
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index_path) and not parts:
        with open(index_path) as f:
            index = json.load(f)
        if index.get("metadata", {}).get("total_size") != total:
            fail(f"index total_size {index.get('metadata')} != data bytes {total}")
        if index.get("weight_map") != where:
            missing = set(where) ^ set(index.get("weight_map", {}))
            fail(f"index weight_map does not match the files (e.g. {sorted(missing)[:3]})")
        n = len(files)
        for i, fname in enumerate(files, 1):
            if fname != f"model-{i:05d}-of-{n:05d}.safetensors":
                fail(f"unexpected shard name {fname}")
    print(f"check_checkpoint: OK {folder}: {len(files)} {'parts' if parts else 'files'}, "
          f"{ntensors} tensors, "
          f"{total} data bytes" + (", data finite" if check_data else ""))


if __name__ == "__main__":
    main()
