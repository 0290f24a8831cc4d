"""Writes seed corpora for the torch zip and pickle fuzzers with real torch.save / pickle.dumps.

Usage: make_torch_seeds.py ZIP_SEED_DIR PICKLE_SEED_DIR   (run with /usr/bin/python3)
"""
import collections
import io
import os
import pickle
import struct
import sys
import zipfile

import torch


def state_dicts():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g)
    yield "flat", collections.OrderedDict([("w", w), ("b", torch.arange(3))])
    yield "tied_views", {"wte": w, "lm_head": w, "t": w.t(), "s": w[1:, 1:],
                         "z": torch.tensor(2.5), "e": torch.zeros(0, 2)}
    yield "dtypes", {str(d): torch.ones(2, dtype=d) for d in
                     [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64,
                      torch.int32, torch.int8, torch.uint8, torch.bool]}
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(lin.parameters())
    lin(torch.randn(1, 3)).sum().backward()
    opt.step()
    yield "nested", {"model": lin.state_dict(), "optimizer": opt.state_dict(), "step": 7,
                     "cfg": {"lr": 1e-3, "name": "gpt", "layers": [1, 2], "x": None}}
    yield "param", {"p": torch.nn.Parameter(torch.ones(2))}


def main(zip_dir, pickle_dir):
    os.makedirs(zip_dir, exist_ok=True)
    os.makedirs(pickle_dir, exist_ok=True)
    for name, obj in state_dicts():
        buf = io.BytesIO()
        torch.save(obj, buf)
        blob = buf.getvalue()
        with open(os.path.join(zip_dir, name + ".pt"), "wb") as f:
            f.write(blob)
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
            with open(os.path.join(pickle_dir, name + ".pkl"), "wb") as f:
                f.write(z.read(pkl))
    # A deflated archive (compressed entries) for the zip fuzzer.
    src = zipfile.ZipFile(os.path.join(zip_dir, "flat.pt"))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in src.namelist():
            z.writestr(n, src.read(n))
    with open(os.path.join(zip_dir, "deflated.zip"), "wb") as f:
        f.write(out.getvalue())
    # Plain pickles of protocol 2 and 4 (no tensors).
    values = {
        "containers": {"a": [1, 2, (3, 4.5)], "b": {1, 2}, "c": frozenset([3]), "d": b"\x00\xff",
                       "e": b"", "f": bytearray(b"xy"), "g": collections.OrderedDict(k=1),
                       "h": -(1 << 70), "i": True, "j": None, "k": "text\u00e9"},
        "shared": (lambda l: [l, l, {"x": l}])([1, 2, 3]),
    }
    for name, value in values.items():
        for protocol in (2, 4):
            with open(os.path.join(pickle_dir, "%s-p%d.pkl" % (name, protocol)), "wb") as f:
                f.write(pickle.dumps(value, protocol=protocol))
    # Bombs of 48 KiB that build more than the fuzzer's 8 MiB cap (pickle_fuzzer.cc).
    n = 48 << 10
    bombs = {
        "bomb-empty-list": b"\x80\x02" + b"]" * n + b".",
        "bomb-empty-dict": b"\x80\x02" + b"}" * n + b".",
        "bomb-empty-tuple": b"\x80\x02" + b")" * n + b".",
        "bomb-mark-tuple": b"\x80\x02" + b"(t" * (n // 2) + b".",
        "bomb-memoize": b"\x80\x04N" + b"\x94" * n + b".",
        "bomb-long-binput": b"\x80\x02N" + b"".join(
            b"r" + struct.pack("<I", i) for i in range(n // 5)) + b".",
        "bomb-marks": b"\x80\x02" + b"(" * n + b".",
        "bomb-binunicode-claimed": b"\x80\x02X" + struct.pack("<I", 0xFFFFFFF0) + b"abc.",
    }
    for name, data in bombs.items():
        with open(os.path.join(pickle_dir, name + ".pkl"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
