"""End-to-end tests of reshard's PyTorch Distributed Checkpoint (DCP) writer (--format torch-dcp)
against real torch.

Run:  /usr/bin/python3 tests/dcp_output_test.py --reshardctl PATH [unittest args, e.g. ClassName]

torch 1.13's torch.distributed.checkpoint does not import on this Python, so the output is read
by an independent reader written here, the way torch's FileSystemReader reads it: `.metadata`
is unpickled by an Unpickler that resolves only the DCP classes current torch writes (mapped
to small stand-ins below) and torch's own Size / dtype / layout globals, and refuses every
other global; each chunk and value is torch.load-ed from its byte range [offset, offset +
length) of its `.distcp` file (chunks with weights_only=True, as current torch loads them).
Tensors are compared element by element (torch.equal) with the tensors the inputs were written
from, whole and, as torch's load planner reads a rank's shard at another world size, box by box
from the chunks that overlap the box.
"""

import enum
import io
import json
import os
import pickle
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_fixture as F  # noqa: E402
import dcp_e2e_test as D  # noqa: E402

RESHARDCTL = None
MD = "torch.distributed.checkpoint.metadata"

# ------------------------------------------------------------------ the independent reader


class Record:
    """A dataclass instance as pickle rebuilds it (NEWOBJ, then BUILD updates __dict__)."""

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.__dict__)


class Metadata(Record):
    planner_data = None
    storage_meta = None
    version = None


class TensorStorageMetadata(Record):
    pass


class ChunkStorageMetadata(Record):
    pass


class BytesStorageMetadata(Record):
    pass


class StorageInfo(Record):
    transform_descriptors = None


class MetadataIndex(Record):
    offset = None
    index = None

    # As torch's: equality and hash by (fqn, offset); `index` is only a hint.
    def __eq__(self, other):
        return (self.fqn, self.offset) == (other.fqn, other.offset)

    def __hash__(self):
        return hash((self.fqn, self.offset))


class TensorProperties(Record):
    def __setstate__(self, state):
        # torch's __getstate__: (dtype, layout, requires_grad, memory format enum, pin_memory).
        assert isinstance(state, tuple) and len(state) == 5, state
        self.dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory = state


class MemFormat(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


ALLOWED = {
    (MD, "Metadata"): Metadata,
    (MD, "TensorStorageMetadata"): TensorStorageMetadata,
    (MD, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (MD, "BytesStorageMetadata"): BytesStorageMetadata,
    (MD, "MetadataIndex"): MetadataIndex,
    (MD, "TensorProperties"): TensorProperties,
    (MD, "_MEM_FORMAT_ENCODING"): MemFormat,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
}


class StrictUnpickler(pickle.Unpickler):
    """Resolves the DCP classes and torch's Size / dtype / layout globals, nothing else."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError("global %s.%s is not allowed in .metadata" % (module, name))


def load_metadata(folder):
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        return StrictUnpickler(f).load()


def read_item(folder, info, chunk=False):
    """The item at [offset, offset + length): a tensor chunk is loaded with weights_only=True,
    as current torch's FileSystemReader loads it; a value (BYTE_IO) with the full unpickler."""
    with open(os.path.join(folder, info.relative_path), "rb") as f:
        f.seek(info.offset)
        data = f.read(info.length)
    assert len(data) == info.length, info
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=chunk)


def iter_dcp(folder, md=None):
    """(fqn, full tensor or value) for every entry, one at a time, as FileSystemReader loads
    them, with checks: chunks inside the tensor, tiling it exactly once, of the metadata's
    dtype and sizes."""
    md = md or load_metadata(folder)
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            yield fqn, read_item(folder, md.storage_data[MetadataIndex_(fqn)])
            continue
        assert isinstance(entry, TensorStorageMetadata), (fqn, entry)
        assert isinstance(entry.size, torch.Size), fqn
        full = torch.zeros(tuple(entry.size), dtype=entry.properties.dtype)
        seen = torch.zeros(tuple(entry.size), dtype=torch.int32)
        for chunk in entry.chunks:
            piece = read_item(folder, md.storage_data[MetadataIndex_(fqn, chunk.offsets)], True)
            assert isinstance(piece, torch.Tensor), fqn
            assert piece.dtype == entry.properties.dtype, (fqn, piece.dtype)
            assert tuple(piece.shape) == tuple(chunk.sizes), (fqn, piece.shape, chunk.sizes)
            view, count = full, seen
            for d, (o, s) in enumerate(zip(chunk.offsets, chunk.sizes)):
                view, count = view.narrow(d, o, s), count.narrow(d, o, s)
            view.copy_(piece)
            count += 1
        assert bool((seen == 1).all()), "%s: chunks do not tile the tensor" % fqn
        yield fqn, full


def load_box(folder, md, fqn, offsets, sizes):
    """The box [offsets, offsets + sizes) of tensor `fqn`, read as torch's load planner reads a
    rank's shard at any world size (_create_read_items): from the saved chunks that overlap the
    box only, each narrowed to the overlap; every element of the box exactly once."""
    entry = md.state_dict_metadata[fqn]
    box = torch.zeros(tuple(sizes), dtype=entry.properties.dtype)
    seen = torch.zeros(tuple(sizes), dtype=torch.int32)
    for chunk in entry.chunks:
        lo = [max(o, c) for o, c in zip(offsets, chunk.offsets)]
        hi = [min(o + s, c + n) for o, s, c, n in zip(offsets, sizes, chunk.offsets, chunk.sizes)]
        if any(h <= l for l, h in zip(lo, hi)):
            continue
        piece = read_item(folder, md.storage_data[MetadataIndex_(fqn, chunk.offsets)], True)
        view, count = box, seen
        for d, (l, h) in enumerate(zip(lo, hi)):
            piece = piece.narrow(d, l - chunk.offsets[d], h - l)
            at = l - offsets[d]
            view, count = view.narrow(d, at, h - l), count.narrow(d, at, h - l)
        view.copy_(piece)
        count += 1
    assert bool((seen == 1).all()), "%s: the chunks do not tile the box %s + %s" % (
        fqn, offsets, sizes)
    return box


def read_dcp(folder):
    """(metadata, fqn -> full tensor or value)."""
    md = load_metadata(folder)
    return md, dict(iter_dcp(folder, md))


def MetadataIndex_(fqn, offset=None):
    key = MetadataIndex()
    key.fqn = fqn
    key.offset = None if offset is None else torch.Size(offset)
    return key


def unflatten(md, flat):
    """The nested state dict torch rebuilds from planner_data."""
    return F.unflatten(flat, {fqn: tuple(path) for fqn, path in md.planner_data.items()})


# ------------------------------------------------------------------ tests


def model_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(12, 8, generator=g),
        "layers.0.qkv.weight": torch.randn(6, 12, generator=g),
        "layers.0.fc.weight": torch.randn(12, 6, generator=g),
        "layers.0.norm.weight": torch.ones(8) + 0.1 * torch.randn(8, generator=g),
        "head.bf16": (torch.randn(12, 4, generator=g) * 30).to(torch.bfloat16),
        "head.fp16": (torch.randn(6, 6, generator=g) * 30).to(torch.float16),
        "ids": torch.arange(-20, 22, dtype=torch.int64).reshape(6, 7),
        "mask": torch.rand(3, 5, generator=g) > 0.5,
        "counts": torch.randint(-1000, 1000, (4, 12), generator=g, dtype=torch.int32),
        "temperature": torch.tensor(0.75),
    }


SPLITS = {"embed.weight": 0, "layers.0.qkv.weight": 1, "layers.0.fc.weight": 0, "head.bf16": 0,
          "ids": 0, "counts": 1}


class Base(D.Base):
    """The DCP reader tests' helpers: assertTensorEqual, assertDeepEqual (element by element)."""
    TMP_PREFIX = "reshard-dcp-out"

    def check_layout(self, out, ranks):
        """The folder holds .metadata and __R_0.distcp for R < ranks (plus reshard's manifest),
        each file exactly the concatenation of its items, every item a zip archive; returns
        the metadata and the loaded entries."""
        names = sorted(n for n in os.listdir(out) if n != "reshard-manifest.json")
        self.assertEqual(names, [".metadata"] + ["__%d_0.distcp" % r for r in range(ranks)])
        md, loaded = read_dcp(out)
        self.assertEqual(md.version, "1.0.0")
        spans = {}
        for key, info in md.storage_data.items():
            self.assertEqual(md.storage_data[key].relative_path, info.relative_path)
            spans.setdefault(info.relative_path, []).append((info.offset, info.length))
            self.assertIn(key.fqn, md.state_dict_metadata)
            self.assertIn(key.fqn, md.planner_data)
        for name, items in spans.items():
            items.sort()
            at = 0
            with open(os.path.join(out, name), "rb") as f:
                data = f.read()
            for offset, length in items:
                self.assertEqual(offset, at, "%s: a gap or overlap before byte %d" % (name, offset))
                self.assertEqual(data[offset:offset + 4], b"PK\x03\x04", name)
                at = offset + length
            self.assertEqual(at, len(data), "%s: bytes after the last item" % name)
        return md, loaded


class DcpWriteTests(Base):

    def test_consolidate_dcp_training_state(self):
        """A 4-rank DCP checkpoint (uneven row shards, a column-major chunk, optimizer state,
        hyper-parameters) consolidated to DCP: one chunk per tensor, values as bytes items,
        planner_data rebuilding torch's nesting."""
        state, shards = D.training_state(5, 4)
        src = self.p("in")
        full, _ = F.write_dcp(src, state, 4, shards)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch-dcp", "--no-progress")
        md, loaded = self.check_layout(out, 1)
        flat, paths = F.flatten_state_dict(state)
        self.assertEqual(list(md.state_dict_metadata), list(flat))
        for fqn, want in flat.items():
            entry = md.state_dict_metadata[fqn]
            if isinstance(want, torch.Tensor):
                self.assertEqual(len(entry.chunks), 1, fqn)
                self.assertEqual(tuple(entry.chunks[0].offsets), (0,) * want.dim(), fqn)
                self.assertEqual(entry.properties.dtype, want.dtype, fqn)
                self.assertIs(entry.properties.memory_format, MemFormat.TORCH_CONTIGUOUS_FORMAT)
                self.assertEqual(entry.properties.layout, torch.strided)
                self.assertFalse(entry.properties.requires_grad)
            else:
                self.assertIsInstance(entry, BytesStorageMetadata, fqn)
            self.assertDeepEqual(loaded[fqn], want, fqn)
        self.assertEqual(md.planner_data, paths)
        self.assertDeepEqual(unflatten(md, loaded), F.unflatten(flat, paths))
        # Values sit before the chunks in rank 0's file, as FileSystemWriter orders them.
        infos = sorted(md.storage_data.items(), key=lambda kv: kv[1].offset)
        kinds = [isinstance(md.state_dict_metadata[k.fqn], BytesStorageMetadata)
                 for k, _ in infos]
        self.assertEqual(kinds, sorted(kinds, reverse=True))
        # reshard's own DCP reader reads it back exactly.
        self.assertExit(self.ctl("verify", src, out), 0)
        doc = self.inspect_json(out)
        self.assertEqual(doc["format"], "torch-dcp")
        self.assertIn("1 rank (__0_0.distcp)", doc["description"])

    def test_consolidate_torch_file_keeps_nesting(self):
        state = {"model": model_state(1), "optimizer": {"step": 3, "lr": 0.5, "name": "adam",
                                                          "betas": (0.9, 0.99)}, "epoch": 2}
        src = self.p("in.pt")
        torch.save(state, src)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch-dcp", "--no-progress")
        md, loaded = self.check_layout(out, 1)
        flat, paths = F.flatten_state_dict(state)
        self.assertEqual(sorted(loaded), sorted(flat))
        for fqn, want in flat.items():
            self.assertDeepEqual(loaded[fqn], want, fqn)
        self.assertDeepEqual(unflatten(md, loaded), F.unflatten(flat, paths))
        self.assertExit(self.ctl("verify", src, out), 0)

    def test_values_holding_tensors_keep_them(self):
        """A tuple is one leaf of torch's flattening: its tensors are pickled inside its bytes
        item (a tensor also held under a key of its own is a chunk too)."""
        g = torch.Generator().manual_seed(9)
        b = torch.randn(3, generator=g)
        state = {"model": {"w": torch.randn(4, 2, generator=g), "b": b},
                 "rng": (torch.arange(5, dtype=torch.int64), "philox", b)}
        src = self.p("in.pt")
        torch.save(state, src)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch-dcp", "--no-progress")
        md, loaded = self.check_layout(out, 1)
        self.assertIsInstance(md.state_dict_metadata["rng"], BytesStorageMetadata)
        self.assertDeepEqual(loaded["rng"], state["rng"])
        self.assertTensorEqual(loaded["model.b"], b, "model.b")
        self.assertDeepEqual(unflatten(md, loaded), state)
        self.assertExit(self.ctl("verify", src, out), 0)

    def test_consolidate_dtype_bf16_from_safetensors(self):
        src = self.p("in")
        os.makedirs(src)
        sd = model_state(2)
        # Through reshard's own safetensors writer, from a torch file.
        torch.save(sd, self.p("sd.pt"))
        self.ok("consolidate", self.p("sd.pt"), src, "--no-progress")
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch-dcp", "--dtype", "bf16",
                "--no-progress")
        md, loaded = self.check_layout(out, 1)
        floats = (torch.float32, torch.float16, torch.bfloat16)
        self.assertEqual(sorted(loaded), sorted(sd))
        for name, t in sd.items():
            want = t.to(torch.bfloat16) if t.dtype in floats else t
            self.assertTensorEqual(loaded[name], want, name)
            self.assertEqual(md.planner_data[name], (name,))

    def reshard_and_check(self, src, sd, parts, prefix=""):
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "^%s$" % (prefix + n).replace(".", "\\."),
                                  "split_dim": d} for n, d in SPLITS.items()] +
                      [{"pattern": ".*", "replicate": True}]}, f)
        out = self.p("out%d" % parts)
        self.ok("reshard", src, out, "--parts", parts, "--rules", rules, "--format", "torch-dcp",
                "--no-progress")
        md, loaded = self.check_layout(out, parts)
        for name, t in sd.items():
            fqn = prefix + name
            self.assertTensorEqual(loaded[fqn], t, fqn)
            chunks = md.state_dict_metadata[fqn].chunks
            if name not in SPLITS:
                # Replicated: stored once, by rank 0.
                self.assertEqual(len(chunks), 1, fqn)
                info = md.storage_data[MetadataIndex_(fqn, chunks[0].offsets)]
                self.assertEqual(info.relative_path, "__0_0.distcp", fqn)
                continue
            dim = SPLITS[name]
            want = torch.chunk(t, parts, dim)
            self.assertEqual(len(chunks), parts, fqn)
            for rank, chunk in enumerate(chunks):
                offsets = [0] * t.dim()
                offsets[dim] = rank * want[0].shape[dim]
                self.assertEqual(tuple(chunk.offsets), tuple(offsets), fqn)
                self.assertEqual(tuple(chunk.sizes), tuple(want[rank].shape), fqn)
                info = md.storage_data[MetadataIndex_(fqn, chunk.offsets)]
                self.assertEqual(info.relative_path, "__%d_0.distcp" % rank, fqn)
                self.assertTensorEqual(read_item(out, info, True), want[rank],
                                       "%s rank %d" % (fqn, rank))
        self.assertExit(self.ctl("verify", src, out), 0)
        return out

    def test_reshard_torch_file_to_2_and_3_ranks(self):
        sd = model_state(3)
        src = self.p("in.pt")
        torch.save(sd, src)
        for parts in (2, 3):
            with self.subTest(parts=parts):
                self.reshard_and_check(src, sd, parts)

    def test_loads_at_any_world_size(self):
        """A checkpoint written for 2 ranks (and one for 3), loaded as torch loads a rank's shard
        at world sizes 1 to 5 cut along every dim (empty shards included)."""
        sd = model_state(7)
        src = self.p("in.pt")
        torch.save(sd, src)
        for parts in (2, 3):
            out = self.reshard_and_check(src, sd, parts)
            md = load_metadata(out)
            for name, t in sd.items():
                if t.dim() == 0:
                    self.assertTensorEqual(load_box(out, md, name, [], []), t, name)
                for dim in range(t.dim()):
                    for world in (1, 2, 3, 4, 5):
                        at = 0
                        for rank, want in enumerate(torch.tensor_split(t, world, dim)):
                            offsets = [0] * t.dim()
                            offsets[dim] = at
                            what = "%s from %d ranks: dim %d, rank %d of %d" % (
                                name, parts, dim, rank, world)
                            self.assertTensorEqual(
                                load_box(out, md, name, offsets, list(want.shape)), want, what)
                            at += want.shape[dim]

    def test_reshard_dcp_to_new_world_size_and_back(self):
        """DCP at 4 ranks -> DCP at 2 ranks -> DCP at 3 ranks, each read back exactly; the
        values stay with rank 0."""
        sd = model_state(4)
        state = {"model": sd, "step": 11}
        shards = {"model.embed.weight": F.Row(4), "model.layers.0.qkv.weight": F.Col(3),
                  "model.layers.0.fc.weight": F.Col(2, column_major=True)}
        src = self.p("in")
        F.write_dcp(src, state, 4, shards)
        out2 = self.reshard_and_check(src, sd, 2, prefix="model.")
        md, loaded = read_dcp(out2)
        self.assertEqual(loaded["step"], 11)
        self.assertEqual(md.planner_data["step"], ("step",))
        self.assertEqual(md.planner_data["model.embed.weight"], ("model", "embed.weight"))
        out3 = self.reshard_and_check(out2, sd, 3, prefix="model.")
        self.assertEqual(read_dcp(out3)[1]["step"], 11)


class DcpWriteRefusalTests(Base):

    def expect_refused(self, res, out, words):
        self.assertExit(res, 3)
        for word in words:
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        self.assertEqual([n for n in os.listdir(os.path.dirname(out)) if "staging" in n], [])

    def test_fused_rule_is_refused_before_writing(self):
        src = self.p("in.pt")
        torch.save({"qkv.weight": torch.randn(6, 4)}, src)
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "qkv", "split_dim": 0, "fused": 3}]}, f)
        out = self.p("out")
        res = self.ctl("reshard", src, out, "--parts", 2, "--rules", rules, "--format",
                       "torch-dcp", "--no-progress")
        self.expect_refused(res, out, ["qkv.weight", "fused"])

    def test_value_holding_split_tensor_is_refused(self):
        src = self.p("in.pt")
        torch.save({"w": torch.randn(2, 2), "rng": (torch.arange(4), "philox")}, src)
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "^rng", "split_dim": 0},
                                 {"pattern": ".*", "replicate": True}]}, f)
        out = self.p("out")
        res = self.ctl("reshard", src, out, "--parts", 2, "--rules", rules, "--format",
                       "torch-dcp", "--no-progress")
        self.expect_refused(res, out, ['tensor "rng.0" is held by a value', "replicate it"])

    def test_killed_before_publishing_leaves_nothing(self):
        src = self.p("in.pt")
        torch.save(model_state(6), src)
        out = self.p("out")
        env = dict(os.environ, RESHARD_TEST_FAULTS="before-publish=kill")
        import subprocess
        res = subprocess.run([RESHARDCTL, "consolidate", src, out, "--format", "torch-dcp",
                              "--no-progress"], env=env, capture_output=True)
        self.assertLess(res.returncode, 0, res)
        self.assertFalse(os.path.exists(out))
        # The rerun removes the stale staging folder and publishes the whole checkpoint.
        self.ok("consolidate", src, out, "--format", "torch-dcp", "--no-progress")
        self.check_layout(out, 1)
        self.assertEqual([n for n in os.listdir(self.p()) if "staging" in n], [])


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
