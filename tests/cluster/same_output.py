"""Checks that a partitioned conversion's published folder equals a single worker's.

Usage: same_output.py REFERENCE_DIR OUTPUT_DIR

Every file byte for byte, except the manifest, whose file and tensor lists (and request) must be
equal and which must carry the split's id. Prints one line and exits 0 when they agree.
"""
import json
import os
import sys


def main(ref: str, out: str) -> None:
    names = sorted(os.listdir(ref))
    assert sorted(os.listdir(out)) == names, (sorted(os.listdir(out)), names)
    for name in names:
        with open(os.path.join(ref, name), "rb") as f:
            a = f.read()
        with open(os.path.join(out, name), "rb") as f:
            b = f.read()
        if name == "reshard-manifest.json":
            ma, mb = json.loads(a), json.loads(b)
            for key in ("files", "tensors", "request"):
                assert ma[key] == mb[key], f"manifest {key} differs"
            assert len(mb["split_id"]) == 16, mb.get("split_id")
        else:
            assert a == b, f"{name} differs from the single-worker run"
    print(f"{out}: {len(names)} files equal to the single-worker run")


if __name__ == "__main__":
    main(*sys.argv[1:3])
