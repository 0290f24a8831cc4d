"""Seeds of the DTensor state dict fuzzer (lib/formats/fsdp:dtensor_fuzzer): the data.pkl of
verl rank files as tests/verl_e2e_test.py writes them (stand-in DTensor classes pickled as torch
2.x pickles DTensors), for both generations of module paths and a 2-d mesh.

Usage: /usr/bin/python3 tests/fuzz/make_dtensor_seeds.py OUT_DIR
"""

import os
import sys
import tempfile
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import verl_e2e_test as V  # noqa: E402


def main(out):
    os.makedirs(out, exist_ok=True)
    cases = [("torch24_w2", dict(world=2)), ("torch20_w2", dict(world=2, ns=V.TORCH_20)),
             ("hsdp_w4", dict(world=4, mesh_shape=(2, 2)))]
    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in cases:
            folder = os.path.join(tmp, label)
            world = kw.pop("world")
            V.write_verl(folder, V.verl_model(1), world, hf=False, **kw)
            path = os.path.join(folder, "model_world_size_%d_rank_%d.pt" % (world, world - 1))
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
                with open(os.path.join(out, label), "wb") as f:
                    f.write(z.read(name))


if __name__ == "__main__":
    main(sys.argv[1])
