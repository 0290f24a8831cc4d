"""End-to-end tests of reshard's PyTorch Distributed Checkpoint (DCP) reader against real torch.

Run:  /usr/bin/python3 tests/dcp_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]

Checkpoints are written by tests/fixtures/dcp_fixture.py exactly as torch's FileSystemWriter
lays them out (real torch.save archives per chunk, the real pickled .metadata classes under
their old and new module paths). reshardctl inspects, consolidates (to safetensors, read back
with tests/st_reference.py, and to torch.save, read back with torch.load) and reshards them;
everything is compared element by element with torch.equal against the tensors the fixture
sharded. Corrupt and hostile checkpoints must exit 3 with a message naming the file and the
problem, never create OUT, and never execute anything.
"""

import argparse
import json
import os
import pickle
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402
import st_reference as R  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_fixture as F  # noqa: E402
from st_torch import TAG_OF, tensor_from_st  # noqa: E402

RESHARDCTL = None
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def training_state(seed, world):
    """A nested training state dict and its sharding over `world` ranks: row-sharded (uneven:
    10 rows over 4 ranks), column-sharded (one stored column-major), replicated, 0-d, bf16 /
    fp16 / int / bool tensors, optimizer state, hyper-parameters and a step counter."""
    g = torch.Generator().manual_seed(seed)
    n = lambda k: min(k, world)  # noqa: E731
    model = {
        "embed.weight": torch.randn(10, 8, generator=g),
        "layers.0.attn.qkv.weight": torch.randn(6, 12, generator=g),
        "layers.0.mlp.fc.weight": torch.randn(8, 6, generator=g),
        "layers.0.norm.weight": torch.ones(8) + 0.1 * torch.randn(8, generator=g),
        "head.bf16": (torch.randn(12, 4, generator=g) * 30).to(torch.bfloat16),
        "head.fp16": (torch.randn(5, 6, generator=g) * 30).to(torch.float16),
        "ids": torch.arange(-20, 22, dtype=torch.int64).reshape(6, 7),
        "mask": torch.rand(3, 5, generator=g) > 0.5,
        "counts": torch.randint(-1000, 1000, (4, 9), generator=g, dtype=torch.int32),
        "temperature": torch.tensor(0.75),
        "num_batches": torch.tensor(123, dtype=torch.int64),
    }
    optim = {
        "state": {
            "embed.weight": {
                "exp_avg": torch.randn(10, 8, generator=g),
                "exp_avg_sq": torch.rand(10, 8, generator=g),
                "step": torch.tensor(5.0),
            },
        },
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0,
                          "amsgrad": False, "foreach": None, "name": "main",
                          "params": ["embed.weight", "layers.0.attn.qkv.weight"]}],
    }
    state = {"model": model, "optim": optim, "step": 7}
    shards = {
        "model.embed.weight": F.Row(n(4)),
        "model.layers.0.attn.qkv.weight": F.Col(n(2)),
        "model.layers.0.mlp.fc.weight": F.Col(n(4), column_major=True),
        "model.head.bf16": F.Row(n(4)),
        "model.head.fp16": F.Col(n(2)),
        "model.ids": F.Row(n(2)),
        "model.counts": F.Col(n(3)),
        "optim.state.embed.weight.exp_avg": F.Row(n(4)),
        "optim.state.embed.weight.exp_avg_sq": F.Row(n(4)),
    }
    return state, shards


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-dcp"

    def inspect(self, path):
        return self.inspect_json(path)

    def write(self, world, modules="new", seed=1, name="ckpt", **kw):
        state, shards = training_state(seed, world)
        folder = self.p(name)
        full, _ = F.write_dcp(folder, state, world, shards, modules=modules, **kw)
        # The fixture reads back with torch.load what torch's FileSystemReader would.
        back = F.read_dcp(folder)
        for fqn, t in full.items():
            self.assertTrue(torch.equal(back[fqn], t), "fixture self-check: %s" % fqn)
        return folder, state, full

    def assertTensorEqual(self, got, want, what):
        self.assertIsInstance(got, torch.Tensor, what)
        self.assertEqual(got.dtype, want.dtype, what)
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        self.assertTrue(torch.equal(got, want.contiguous()), "%s: values differ" % what)

    def assertStEqual(self, expected, actual, what=""):
        """expected: name -> torch tensor; actual: name -> st_reference Tensor."""
        self.assertEqual(sorted(expected), sorted(actual), what)
        for name, want in expected.items():
            self.assertTensorEqual(tensor_from_st(actual[name]), want, "%s %s" % (what, name))

    def assertDeepEqual(self, got, want, path="root"):
        """Recursive equality; tensors by torch.equal; container types and key types kept."""
        if isinstance(want, torch.Tensor):
            self.assertTensorEqual(got, want, path)
            return
        self.assertIs(type(got), type(want), "%s: %r vs %r" % (path, type(got), type(want)))
        if isinstance(want, dict):
            self.assertEqual(list(got.keys()), list(want.keys()), path)
            for k in want:
                self.assertDeepEqual(got[k], want[k], "%s[%r]" % (path, k))
        elif isinstance(want, (list, tuple)):
            self.assertEqual(len(got), len(want), path)
            for i, (a, b) in enumerate(zip(got, want)):
                self.assertDeepEqual(a, b, "%s[%d]" % (path, i))
        else:
            self.assertEqual(got, want, path)

    def load_torch_output(self, out):
        self.assertIn("pytorch_model.bin", os.listdir(out))
        # torch 1.13's weights_only unpickler has no BINFLOAT: the state holds Python floats.
        return torch.load(os.path.join(out, "pytorch_model.bin"), map_location="cpu",
                          weights_only=False)


class DcpReadTests(Base):

    def consolidate_and_compare(self, world, modules):
        src, state, full = self.write(world, modules)
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.assertStEqual(full, R.read_folder(out), "%d ranks, %s paths" % (world, modules))
        self.assertExit(self.ctl("verify", src, out), 0)

    def test_consolidate_2_ranks_new_module_paths(self):
        self.consolidate_and_compare(2, "new")

    def test_consolidate_2_ranks_old_module_paths(self):
        self.consolidate_and_compare(2, "old")

    def test_consolidate_4_ranks_new_module_paths(self):
        self.consolidate_and_compare(4, "new")

    def test_consolidate_4_ranks_old_module_paths(self):
        self.consolidate_and_compare(4, "old")

    def test_inspect_names_dtypes_shapes_and_description(self):
        src, state, full = self.write(4)
        doc = self.inspect(src)
        self.assertEqual(doc["format"], "torch-dcp")
        self.assertEqual(doc["layout"], "sharded")
        self.assertEqual(doc["parts"], 1)
        with open(os.path.join(src, ".metadata"), "rb") as f:
            md = pickle.load(f)
        chunks = sum(len(e.chunks) for e in md.state_dict_metadata.values()
                     if isinstance(e, F.TensorStorageMetadata))
        values = sum(1 for e in md.state_dict_metadata.values()
                     if isinstance(e, F.BytesStorageMetadata))
        self.assertEqual(
            doc["description"],
            "PyTorch DCP, 4 ranks (__0_0 .. __3_0.distcp), %d tensors in %d chunks, %d other values"
            % (len(full), chunks, values))
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(sorted(got), sorted(full))
        for name, t in full.items():
            self.assertEqual(got[name]["dtype"], TAG_OF[t.dtype], name)
            self.assertEqual(got[name]["shape"], list(t.shape), name)
        self.assertEqual(got["model.embed.weight"]["pieces"], 4)
        self.assertEqual(got["model.temperature"]["shape"], [])
        joined = "\n".join(doc.get("other_entries", []))
        for key in ("step: int", "optim.param_groups.0.lr: float",
                    "optim.param_groups.0.betas.0: float", "optim.param_groups.0.name: str"):
            self.assertIn(key, joined)
        # The human-readable form shows the description too; the .metadata file itself probes.
        self.assertIn("PyTorch DCP, 4 ranks", self.ok("inspect", src).stdout_text)
        self.assertEqual(self.inspect(os.path.join(src, ".metadata"))["format"], "torch-dcp")

    def test_consolidate_to_torch_keeps_nesting_and_values(self):
        for world, modules in ((2, "old"), (4, "new")):
            with self.subTest(world=world, modules=modules):
                src, state, full = self.write(world, modules, name="ckpt%d" % world)
                out = self.p("out%d" % world)
                self.ok("consolidate", src, out, "--no-progress", "--format", "torch")
                got = self.load_torch_output(out)
                # What torch's own dcp_to_torch_save rebuilds: plain dicts from planner_data.
                want = F.unflatten(*F.flatten_state_dict(state))
                self.assertDeepEqual(got, want)
                self.assertEqual(got["step"], 7)
                self.assertIsInstance(got["optim"]["param_groups"][0]["betas"], tuple)
                self.assertIsNone(got["optim"]["param_groups"][0]["foreach"])
                self.assertIs(got["optim"]["param_groups"][0]["amsgrad"], False)
                self.assertEqual(got["optim"]["param_groups"][0]["params"],
                                 ["embed.weight", "layers.0.attn.qkv.weight"])

    def test_dtype_bf16_equals_torch_conversion(self):
        src, state, full = self.write(4)
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress", "--dtype", "bf16")
        want = {k: (t.to(torch.bfloat16) if t.dtype in FLOATS else t) for k, t in full.items()}
        self.assertStEqual(want, R.read_folder(out), "--dtype bf16")

    def test_reshard_to_two_parts_with_rules(self):
        src, state, full = self.write(4)
        rules = self.p("rules.json")
        splits = {"model.embed.weight": 0, "model.layers.0.attn.qkv.weight": 1,
                  "model.layers.0.mlp.fc.weight": 0, "model.head.bf16": 1,
                  "optim.state.embed.weight.exp_avg": 0}
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "^%s$" % name.replace(".", "\\."), "split_dim": dim}
                                 for name, dim in splits.items()] +
                      [{"pattern": ".*", "replicate": True}]}, f)
        out = self.p("out")
        self.ok("reshard", src, out, "--parts", 2, "--rules", rules, "--no-progress")
        for rank in range(2):
            part = R.read_file(os.path.join(out, "model_part-%d.safetensors" % rank))
            want = {}
            for name, t in full.items():
                want[name] = torch.chunk(t, 2, splits[name])[rank] if name in splits else t
            self.assertStEqual(want, part, "part %d" % rank)

    def test_one_file_per_item_and_empty_ranks(self):
        # torch 1.13's default single_file_per_rank=False: one __R_N.distcp per write item.
        src, state, full = self.write(2, "old", single_file_per_rank=False)
        doc = self.inspect(src)
        self.assertRegex(doc["description"], r"^PyTorch DCP, 2 ranks in \d+ files \(__0_0 \.\. ")
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.assertStEqual(full, R.read_folder(out))
        # Replicated tensors only, all written by rank 0: ranks 1-3 leave empty files.
        g = torch.Generator().manual_seed(4)
        sd = {"w": torch.randn(3, 4, generator=g), "b": torch.zeros(4, dtype=torch.float16)}
        src2 = self.p("replicated")
        full2, _ = F.write_dcp(src2, sd, 4, modules="new", dedup="lowest")
        self.assertEqual(os.path.getsize(os.path.join(src2, "__3_0.distcp")), 0)
        doc = self.inspect(src2)
        self.assertEqual(doc["layout"], "single-file")
        self.assertTrue(doc["description"].startswith("PyTorch DCP, 4 ranks (__0_0 .. __3_0.distcp)"),
                        doc["description"])
        out2 = self.p("out2")
        self.ok("consolidate", src2, out2, "--no-progress")
        self.assertStEqual(full2, R.read_folder(out2))

    def test_without_planner_data_values_stay_flat(self):
        src, state, full = self.write(2, planner_data=False)
        self.assertIn("flat (no planner_data)", self.inspect(src)["description"])
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress", "--format", "torch")
        got = self.load_torch_output(out)
        flat, _ = F.flatten_state_dict(state)
        self.assertDeepEqual(got, flat)

    def test_values_holding_tensors_and_objects(self):
        # A tuple is a leaf of DCP's flattening, so a tuple of tensors is one BYTE_IO item; a
        # Python object (argparse.Namespace) is listed but not carried (None in torch output).
        g = torch.Generator().manual_seed(8)
        sd = {"model": {"w": torch.randn(6, 2, generator=g)},
              "rng": (torch.arange(5, dtype=torch.int64), "philox", 3),
              "args": argparse.Namespace(lr=0.1, name="run")}
        src = self.p("ckpt")
        full, _ = F.write_dcp(src, sd, 2, {"model.w": F.Row(2)})
        other = self.inspect(src)["other_entries"]
        self.assertTrue(any(e.startswith("args: ") and "not carried" in e for e in other), other)
        self.assertIn("rng.1: str", other)
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.assertStEqual({"model.w": full["model.w"], "rng.0": sd["rng"][0]}, R.read_folder(out))
        out2 = self.p("out2")
        self.ok("consolidate", src, out2, "--no-progress", "--format", "torch")
        want = dict(sd, args=None)
        self.assertDeepEqual(self.load_torch_output(out2), want)


class DcpCrcTests(Base):

    def test_flipped_byte_in_a_chunk_is_data_loss(self):
        """A byte flipped in the data of one chunk (a torch.save archive inside a .distcp file):
        exit 3 naming the .distcp file, the archive's zip entry and the tensor."""
        g = torch.Generator().manual_seed(12)
        sd = {"model": {"w": torch.randn(64, 16, generator=g), "b": torch.randn(16, generator=g)}}
        src = self.p("ckpt")
        full, _ = F.write_dcp(src, sd, 2, {"model.w": F.Row(2)})
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.assertStEqual(full, R.read_folder(out))
        # Rows 32..63 of model.w: the chunk of the second rank.
        chunk = full["model.w"][32:].contiguous().numpy().tobytes()
        found = []
        for name in sorted(os.listdir(src)):
            path = os.path.join(src, name)
            with open(path, "rb") as f:
                at = f.read().find(chunk)
            if at >= 0:
                found.append((name, path, at))
        self.assertEqual(len(found), 1, found)
        name, path, at = found[0]
        harness.flip_byte(path, at + len(chunk) // 2)
        out = self.p("out-crc")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        for word in (name, 'zip entry "', 'tensor "model.w"', "CRC-32"):
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))


class DcpRefusalTests(Base):

    def expect_rejected(self, src, problem_words, name_in_msg):
        """Exit 3, a message naming the file and the problem, OUT not created; inspect agrees."""
        out = self.p("out-rejected")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        msg = res.stderr_text + res.stdout_text
        self.assertIn(name_in_msg, msg, self.describe(res))
        low = msg.lower()
        self.assertTrue(any(w.lower() in low for w in problem_words),
                        "none of %s in the message%s" % (problem_words, self.describe(res)))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        res = self.ctl("inspect", src, "--json")
        self.assertExit(res, 3)
        doc = json.loads(res.stdout_text)
        self.assertFalse(doc["ok"])
        self.assertEqual(doc["exit_code"], 3)
        return msg

    def small(self, modules="new"):
        g = torch.Generator().manual_seed(3)
        sd = {"model": {"w": torch.randn(8, 4, generator=g), "v": torch.randn(4, 6, generator=g)},
              "step": 3}
        src = self.p("ckpt")
        F.write_dcp(src, sd, 2, {"model.w": F.Row(2), "model.v": F.Col(2)}, modules=modules)
        return src

    def metadata(self, src):
        with open(os.path.join(src, ".metadata"), "rb") as f:
            return pickle.load(f)

    def test_good_checkpoint_baseline(self):
        self.assertEqual(len(self.inspect(self.small())["tensors"]), 2)

    def test_missing_data_file(self):
        src = self.small()
        os.remove(os.path.join(src, "__1_0.distcp"))
        self.expect_rejected(src, ["missing"], "__1_0.distcp")

    def test_truncated_data_file(self):
        src = self.small()
        path = os.path.join(src, "__1_0.distcp")
        size = os.path.getsize(path)
        for cut in (size - 1, size // 2, 10):
            with open(path, "r+b") as f:
                f.truncate(cut)
            self.expect_rejected(src, ["truncated"], "__1_0.distcp")

    def test_corrupt_archive_inside_data_file(self):
        src = self.small()
        path = os.path.join(src, "__1_0.distcp")
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            end = data.rfind(b"PK\x05\x06")  # the last archive's end-of-central-directory
            data[end:end + 4] = b"XXXX"
            f.seek(0)
            f.write(data)
        self.expect_rejected(src, ["zip", "central directory", "end of"], "__1_0.distcp")

    def test_chunks_not_covering_the_tensor(self):
        src = self.small()
        md = self.metadata(src)
        md.state_dict_metadata["model.w"].chunks.pop()
        F.write_metadata(src, md)
        msg = self.expect_rejected(src, ["lacks data", "cover"], ".metadata")
        self.assertIn("model.w", msg)

    def test_overlapping_chunks(self):
        src = self.small()
        md = self.metadata(src)
        # Rows 0-3 and 3-6: the volume still matches [8, 4], row 3 is twice, row 7 never.
        md.state_dict_metadata["model.w"].chunks[1].offsets = torch.Size([3, 0])
        info = md.storage_data.pop(F.MetadataIndex("model.w", (4, 0)))
        md.storage_data[F.MetadataIndex("model.w", (3, 0), 1)] = info
        F.write_metadata(src, md)
        msg = self.expect_rejected(src, ["overlap"], ".metadata")
        self.assertIn("model.w", msg)

    def test_relative_path_escaping_the_folder(self):
        src = self.small()
        shutil.copy(os.path.join(src, "__1_0.distcp"), self.p("x.distcp"))
        md = self.metadata(src)
        for info in md.storage_data.values():
            if info.relative_path == "__1_0.distcp":
                info.relative_path = "../x.distcp"
        F.write_metadata(src, md)
        self.expect_rejected(src, ["leaves the checkpoint folder"], "../x.distcp")
        for info in md.storage_data.values():
            if info.relative_path == "../x.distcp":
                info.relative_path = self.p("x.distcp")  # absolute
        F.write_metadata(src, md)
        self.expect_rejected(src, ["absolute path"], "x.distcp")

    def test_archive_shape_disagrees_with_metadata(self):
        # Chunks still tile [8, 4] (rows 0-2 and 3-7), but the archives hold 4 rows each.
        src = self.small()
        md = self.metadata(src)
        chunks = md.state_dict_metadata["model.w"].chunks
        chunks[0].sizes = torch.Size([3, 4])
        chunks[1].offsets = torch.Size([3, 0])
        chunks[1].sizes = torch.Size([5, 4])
        info = md.storage_data.pop(F.MetadataIndex("model.w", (4, 0)))
        md.storage_data[F.MetadataIndex("model.w", (3, 0), 1)] = info
        F.write_metadata(src, md)
        msg = self.expect_rejected(src, ["shape [4, 4]"], "__0_0.distcp")
        self.assertIn("model.w", msg)
        self.assertIn("sizes [3, 4]", msg)

    def test_archive_dtype_disagrees_with_metadata(self):
        src = self.small("old")
        md = self.metadata(src)
        md.state_dict_metadata["model.v"].properties.dtype = torch.float16
        F.write_metadata(src, md)
        msg = self.expect_rejected(src, ["metadata says F16"], ".distcp")
        self.assertIn("model.v", msg)

    def test_stream_transform_is_unimplemented(self):
        src = self.small()
        md = self.metadata(src)
        next(iter(md.storage_data.values())).transform_descriptors = ["stream.zstd/1"]
        F.write_metadata(src, md)
        self.expect_rejected(src, ["stream.zstd/1"], ".distcp")

    def test_metadata_never_executes_code(self):
        marker = self.p("pwned")

        class Evil:
            def __reduce__(self):
                return (os.system, ("touch %s" % marker,))

        src = self.small()
        md = self.metadata(src)
        md.state_dict_metadata["model.evil"] = Evil()
        F.write_metadata(src, md)
        self.expect_rejected(src, ["neither TensorStorageMetadata"], "model.evil")
        self.assertFalse(os.path.exists(marker), "the pickle ran code")

    def test_missing_and_garbage_metadata(self):
        src = self.small()
        os.remove(os.path.join(src, ".metadata"))
        self.expect_rejected(src, ["missing"], ".metadata")
        with open(os.path.join(src, ".metadata"), "wb") as f:
            f.write(b"\x80\x04\x95garbage")
        self.expect_rejected(src, ["pickle", "opcode"], ".metadata")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
