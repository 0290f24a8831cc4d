"""Writes `.metadata` seeds for the DCP metadata fuzzer with tests/fixtures/dcp_fixture.py
(the pickles torch's FileSystemWriter writes, old and new module paths).

Usage: make_dcp_seeds.py SEED_DIR   (run with /usr/bin/python3)
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import dcp_fixture as F  # noqa: E402

import torch  # noqa: E402


def main(seed_dir):
    os.makedirs(seed_dir, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    state = {
        "model": {"w": torch.randn(10, 6, generator=g), "b": torch.randn(6, generator=g),
                  "s": torch.tensor(1.5), "h": torch.ones(4, 4, dtype=torch.bfloat16)},
        "step": 7,
        "cfg": {"lr": 0.001, "name": "x", "layers": [1, 2]},
    }
    shards = {"model.w": F.Row(4), "model.h": F.Col(2)}
    for modules in ("old", "new"):
        for planner in (True, False):
            tmp = tempfile.mkdtemp(prefix="reshard-dcp-seed-")
            try:
                F.write_dcp(tmp, state, 4, shards=shards, modules=modules, planner_data=planner)
                name = "%s-%s.metadata" % (modules, "planner" if planner else "flat")
                shutil.copyfile(os.path.join(tmp, ".metadata"), os.path.join(seed_dir, name))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
