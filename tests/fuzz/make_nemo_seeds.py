"""Seed corpora of the NeMo parsers: small .nemo-like tar archives (GNU and pax long names, a
folder, a symlink, members prefixed ./), model_config.yaml texts as OmegaConf writes them, and
NeMo 2 context/io.json texts as fiddle serializes a TrainerContext
(tests/fixtures/nemo_io_json_fixture.py), and SentencePiece tokenizer.model files.

Usage: make_nemo_seeds.py TAR_DIR YAML_DIR IOJSON_DIR SPM_DIR
"""

import io
import os
import sys
import tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import nemo_io_json_fixture as io_fixture  # noqa: E402

CONFIG = """mcore_gpt: true
tensor_model_parallel_size: 2
pipeline_model_parallel_size: 1
num_layers: 2
activation: fast-swiglu
tokenizer:
  library: sentencepiece
  model: nemo:0123456789abcdef0123456789abcdef_tokenizer.model
optim:
  betas:
  - 0.9
  - 0.98
  sched: [1, 2]
data:
  - name: 'a''b'
    weight: "x"
"""


def tar_bytes(fmt, members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main():
    tar_dir, yaml_dir, iojson_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(iojson_dir, exist_ok=True)
    spm_dir = sys.argv[4]
    os.makedirs(spm_dir, exist_ok=True)
    import nemo_fixture  # noqa: E402  (torch: the tests' own fixture writer)
    for name, blob in (("default.model", nemo_fixture.sentencepiece_blob(20)),
                       ("gemma.model", nemo_fixture.sentencepiece_blob(20, bos=5, eos=7, pad=3))):
        with open(os.path.join(spm_dir, name), "wb") as f:
            f.write(blob)
    config = io_fixture.model_config("nemo.collections.llm.gpt.model.llama", "LlamaConfig",
                                     {"num_layers": 2, "hidden_size": 16,
                                      "layernorm_epsilon": 1e-06, "gated_linear_unit": True})
    with open(os.path.join(iojson_dir, "io.json"), "w") as f:
        f.write(io_fixture.io_json(io_fixture.trainer_context(config)))
    with open(os.path.join(iojson_dir, "small.json"), "w") as f:
        f.write(io_fixture.io_json(io_fixture.trainer_context(
            io_fixture.FdlConfig("m", "C", {"num_layers": 1}))))
    os.makedirs(tar_dir, exist_ok=True)
    os.makedirs(yaml_dir, exist_ok=True)
    members = [
        ("./", b"", "dir"),
        ("./model_config.yaml", CONFIG.encode(), "file"),
        ("./mp_rank_00", b"", "dir"),
        ("./mp_rank_00/model_weights.ckpt", b"PK" + b"\0" * 100, "file"),
        ("./" + "d" * 120 + "/tokenizer.model", b"t" * 600, "file"),
        ("./link", "model_config.yaml", "sym"),
    ]
    for fmt, name in [(tarfile.GNU_FORMAT, "gnu.nemo"), (tarfile.PAX_FORMAT, "pax.nemo"),
                      (tarfile.USTAR_FORMAT, "ustar.nemo")]:
        usable = members if fmt != tarfile.USTAR_FORMAT else members[:4]
        with open(os.path.join(tar_dir, name), "wb") as f:
            f.write(tar_bytes(fmt, usable))
    with open(os.path.join(yaml_dir, "config.yaml"), "w") as f:
        f.write(CONFIG)
    with open(os.path.join(yaml_dir, "small.yaml"), "w") as f:
        f.write("a: 1\nb:\n  c: [x, y]\n  d:\n  - e\n")


if __name__ == "__main__":
    main()
