"""Seeds of the OLMo flat parameter fuzzer (lib/formats/fsdp:flat_param_fuzzer): the data.pkl of
model/rank{N}.pt files as tests/olmo_sharded_e2e_test.py writes them (FSDP flat parameters over
3 ranks, parameters spanning ranks, padding on the last), with torch >= 2.1's and torch <= 2.0's
shard fields.

Usage: /usr/bin/python3 tests/fuzz/make_flat_param_seeds.py OUT_DIR
"""

import os
import sys
import tempfile
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import olmo_sharded_e2e_test as O  # noqa: E402


def main(out):
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label, new_fields in (("torch21", True), ("torch20", False)):
            folder = os.path.join(tmp, label)
            O.write_olmo_sharded(folder, O.olmo_model(1), 3, new_fields=new_fields)
            for rank in range(3):
                path = os.path.join(folder, "model", "rank%d.pt" % rank)
                with zipfile.ZipFile(path) as z:
                    name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
                    with open(os.path.join(out, "%s_rank%d" % (label, rank)), "wb") as f:
                        f.write(z.read(name))


if __name__ == "__main__":
    main(sys.argv[1])
