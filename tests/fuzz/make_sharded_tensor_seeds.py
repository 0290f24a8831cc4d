"""Seeds of the ShardedTensor state dict fuzzer (lib/formats/fsdp:sharded_tensor_fuzzer): the
data.pkl of FSDP1 SHARDED_STATE_DICT rank files as tests/fsdp1_e2e_test.py writes them (stand-in
ShardedTensor classes pickled as torch 2.x pickles them), for world sizes 2 and 3, the last rank
of each (a short chunk, and no local shard for a tensor torch.chunk leaves it nothing of).

Usage: /usr/bin/python3 tests/fuzz/make_sharded_tensor_seeds.py OUT_DIR
"""

import os
import sys
import tempfile
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fsdp1_e2e_test as F  # noqa: E402


def main(out):
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for world in (2, 3):
            folder = os.path.join(tmp, "w%d" % world)
            F.write_fsdp1(folder, F.fsdp1_model(1), world)
            path = os.path.join(folder, "model_rank%d.pt" % (world - 1))
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
                with open(os.path.join(out, "fsdp1_w%d" % world), "wb") as f:
                    f.write(z.read(name))


if __name__ == "__main__":
    main(sys.argv[1])
