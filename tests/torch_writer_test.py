"""Acceptance tests of reshard's torch.save writer against real PyTorch (Debian python3-torch).

Run:  /usr/bin/python3 tests/torch_writer_test.py --reshardctl PATH [unittest args, e.g. ClassName]

Covers issue 4's writer side: .pt -> safetensors -> .pt round trips (tied weights, every dtype,
views, 0-d and empty tensors) loaded with torch.load(weights_only=True); nested checkpoints kept
on .pt -> .pt; --dtype bf16 bit for bit; sharded torch output with a Hugging Face index; metaseq
model-parallel parts 2 -> 4 -> 1 and 2 -> 1 compared with slices computed here; and the zip
framing (real CRC-32s, 64-byte aligned data records) of every file reshard writes.

torch 1.13's weights_only unpickler has no BINFLOAT, so checkpoints holding Python floats
(optimizer param_groups, cfg dicts) are loaded with plain torch.load; weights_only=True is used
on every float-free state dict.
"""

import collections
import json
import os
import struct
import sys
import zipfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import harness  # noqa: E402
from gpt2_fixture import gpt2_like  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip

RESHARDCTL = None
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------- helpers

def mixed_state_dict(seed):
    """gpt2_like + every dtype, non-contiguous views, a 0-d and empty tensors (no Python floats)."""
    g = torch.Generator().manual_seed(seed)
    sd = gpt2_like(seed)
    sd["x.bf16"] = (torch.randn(5, 7, generator=g) * 50).to(torch.bfloat16)
    sd["x.f16"] = (torch.randn(3, 9, generator=g) * 50).to(torch.float16)
    sd["x.f32"] = torch.randn(4, 4, generator=g)
    sd["x.i64"] = torch.randint(-(1 << 40), 1 << 40, (6,), generator=g, dtype=torch.int64)
    sd["x.i8"] = torch.randint(-128, 128, (3, 5), generator=g).to(torch.int8)
    sd["x.u8"] = torch.randint(0, 256, (11,), generator=g).to(torch.uint8)
    sd["x.bool"] = torch.rand(2, 3, 4, generator=g) > 0.5
    base = torch.randn(8, 6, generator=g)
    sd["v.transposed"] = base.t()                           # strides (1, 6)
    sd["v.rows"] = base[3:7]                                # storage offset 18
    sd["v.cols"] = base[:, 2:5]                             # offset + non-contiguous
    sd["v.half_t"] = (torch.randn(6, 10, generator=g).to(torch.float16)).t()[2:]
    sd["s.scalar"] = torch.tensor(2.5)
    sd["s.scalar_i64"] = torch.tensor(-9, dtype=torch.int64)
    sd["e.empty"] = torch.zeros(0)
    sd["e.empty2d"] = torch.zeros(3, 0, dtype=torch.bfloat16)
    return sd


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def flatten(obj, prefix=""):
    """Dotted names -> tensors, as reshard names nested state dicts."""
    out = collections.OrderedDict()
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, "%s.%d" % (prefix, i) if prefix else str(i)))
    return out


def bits(t):
    """A view of t's bits as an integer tensor (for bit-for-bit float comparison)."""
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-torchw"

    def ok(self, *args):
        res = self.ctl(*args, "--no-progress")
        self.assertExit(res, 0)
        return res

    def check_torch_zip(self, path):
        """Real CRC-32s (testzip) and every data/ record's payload 64-byte aligned."""
        with zipfile.ZipFile(path) as z:
            self.assertIsNone(z.testzip(), "%s: bad CRC" % path)
            infos = z.infolist()
            self.assertTrue(infos, path)
            prefix = infos[0].filename.split("/")[0]
            names = [i.filename for i in infos]
            self.assertIn(prefix + "/data.pkl", names, path)
            for i in infos:
                self.assertEqual(i.compress_type, zipfile.ZIP_STORED, "%s %s" % (path, i.filename))
                self.assertTrue(i.filename.startswith(prefix + "/"), i.filename)
        with open(path, "rb") as f:
            data = f.read()
        n_data = 0
        for i in infos:
            off = i.header_offset
            self.assertEqual(data[off:off + 4], b"PK\x03\x04", "%s %s" % (path, i.filename))
            name_len, extra_len = struct.unpack("<HH", data[off + 26:off + 30])
            payload = off + 30 + name_len + extra_len
            if "/data/" in i.filename:
                n_data += 1
                self.assertEqual(payload % 64, 0, "%s: %s payload at %d is not 64-byte aligned"
                                 % (path, i.filename, payload))
        return n_data

    def load(self, path, weights_only=True):
        self.check_torch_zip(path)
        return torch.load(path, map_location="cpu", weights_only=weights_only)

    def assertTensorEqual(self, got, want, what):
        self.assertIsInstance(got, torch.Tensor, what)
        self.assertEqual(got.dtype, want.dtype, what)
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        self.assertTrue(torch.equal(got, want.contiguous()), "%s: values differ" % what)

    def assertTensorsEqual(self, got, want, what=""):
        self.assertEqual(sorted(got), sorted(want), what)
        for name in want:
            self.assertTensorEqual(got[name], want[name], "%s %s" % (what, name))

    def assertDeepEqual(self, got, want, path="root"):
        """Recursive equality; tensors by torch.equal; container types and key types kept."""
        if isinstance(want, torch.Tensor):
            self.assertTensorEqual(got, want, path)
            return
        # Container kinds are kept exactly: dict vs OrderedDict vs list vs tuple.
        self.assertIs(type(got), type(want), "%s: %r vs %r" % (path, type(got), type(want)))
        if isinstance(want, dict):
            self.assertEqual(list(got.keys()), list(want.keys()), path)
            for k in want:
                self.assertIs(type(k), type(next(x for x in got if x == k)), "%s key %r" % (path, k))
                self.assertDeepEqual(got[k], want[k], "%s[%r]" % (path, k))
        elif isinstance(want, (list, tuple)):
            self.assertEqual(len(got), len(want), path)
            for i, (a, b) in enumerate(zip(got, want)):
                self.assertDeepEqual(a, b, "%s[%d]" % (path, i))
        else:
            self.assertEqual(got, want, path)


# ---------------------------------------------------------------------------- 1, 3, 6

class RoundTripTests(Base):

    def to_safetensors_and_back(self, sd, *st_args):
        src = self.p("src.pt")
        torch.save(sd, src)
        st = self.p("st")
        self.ok("consolidate", src, st, *st_args)
        st_file = os.path.join(st, "model.safetensors")
        self.assertTrue(os.path.exists(st_file), os.listdir(st))
        pt = self.p("pt")
        self.ok("consolidate", st_file, pt, "--format", "torch")
        self.assertIn("pytorch_model.bin", os.listdir(pt))
        return st_header(st_file), self.load(os.path.join(pt, "pytorch_model.bin"))

    def test_round_trip_pt_safetensors_pt(self):
        sd = mixed_state_dict(seed=1)
        header, got = self.to_safetensors_and_back(sd)
        self.assertIsInstance(got, dict)
        self.assertTensorsEqual(got, sd, "round trip")
        # The tied pair shares one storage in the .pt written by reshard.
        a, b = got["transformer.wte.weight"], got["lm_head.weight"]
        self.assertEqual(a.data_ptr(), b.data_ptr(), "tied pair not sharing storage")
        self.assertEqual(a.storage().data_ptr(), b.storage().data_ptr())
        # Stored once in safetensors, the alias in __metadata__.
        meta = header.get("__metadata__", {})
        stored = set(header) - {"__metadata__"}
        tied = {"transformer.wte.weight", "lm_head.weight"}
        self.assertEqual(len(stored & tied), 1, sorted(stored))
        kept = (stored & tied).pop()
        alias = (tied - {kept}).pop()
        self.assertEqual(meta.get(alias), kept, meta)
        # Only the tied pair is an alias: views of other storages are plain tensors.
        self.assertEqual(stored | {alias}, set(sd), sorted(stored))
        self.assertEqual([k for k in meta if k in sd], [alias], meta)

    def test_duplicate_tied_stores_twice(self):
        sd = mixed_state_dict(seed=2)
        header, got = self.to_safetensors_and_back(sd, "--duplicate-tied")
        self.assertIn("transformer.wte.weight", header)
        self.assertIn("lm_head.weight", header)
        self.assertNotIn("lm_head.weight", header.get("__metadata__", {}))
        self.assertNotIn("transformer.wte.weight", header.get("__metadata__", {}))
        a, b = header["transformer.wte.weight"], header["lm_head.weight"]
        self.assertNotEqual(a["data_offsets"], b["data_offsets"])
        self.assertTensorsEqual(got, sd, "round trip --duplicate-tied")

    def test_pt_to_pt_direct_flat_keeps_ties_and_views(self):
        sd = mixed_state_dict(seed=3)
        src = self.p("src.pt")
        torch.save(sd, src)
        out = self.p("pt")
        self.ok("consolidate", src, out, "--format", "torch")
        got = self.load(os.path.join(out, "pytorch_model.bin"))
        self.assertEqual(list(got), list(sd), "order or names changed")
        self.assertTensorsEqual(got, sd, "pt -> pt")
        self.assertEqual(got["transformer.wte.weight"].data_ptr(), got["lm_head.weight"].data_ptr())

    def test_dtype_bf16_torch_output_bit_for_bit(self):
        sd = mixed_state_dict(seed=4)
        # Values that need rounding (ties to even, NaN/Inf, subnormals) in the F32 inputs.
        sd["r.special"] = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, float("inf"),
                                        -float("inf"), 1e-40, -0.0, 3.4e38, 1.00390625])
        src = self.p("src.pt")
        torch.save(sd, src)
        out = self.p("pt-bf16")
        self.ok("consolidate", src, out, "--dtype", "bf16", "--format", "torch")
        got = self.load(os.path.join(out, "pytorch_model.bin"))
        self.assertEqual(sorted(got), sorted(sd))
        for name, t in sd.items():
            want = t.to(torch.bfloat16) if t.dtype in FLOATS else t
            g = got[name]
            self.assertEqual(g.dtype, want.dtype, name)
            self.assertEqual(tuple(g.shape), tuple(want.shape), name)
            self.assertTrue(torch.equal(bits(g), bits(want)), "%s: bits differ" % name)
        # NaN keeps being NaN (checked apart: NaN payloads may legitimately differ).
        sd2 = {"n": torch.tensor([float("nan"), 1.0, -float("nan")])}
        torch.save(sd2, self.p("nan.pt"))
        self.ok("consolidate", self.p("nan.pt"), self.p("nan-out"), "--dtype", "bf16",
                "--format", "torch")
        g = self.load(self.p("nan-out", "pytorch_model.bin"))["n"]
        self.assertEqual(g.dtype, torch.bfloat16)
        self.assertEqual(g.isnan().tolist(), [True, False, True])

    def test_written_files_are_valid_zips_with_aligned_records(self):
        sd = mixed_state_dict(seed=5)
        src = self.p("src.pt")
        torch.save(sd, src)
        out = self.p("pt")
        self.ok("consolidate", src, out, "--format", "torch")
        path = os.path.join(out, "pytorch_model.bin")
        n = self.check_torch_zip(path)
        # One record per storage (the tied pair and the views of one base share theirs).
        self.assertGreater(n, 10)
        # Flipping one payload byte must be caught by the CRC (the CRCs are real ones).
        record = harness.largest_record(path)
        offset, _ = harness.stored_entry(path, record)
        bad = harness.flip_byte(path, offset + 5, self.p("bad.bin"))
        with zipfile.ZipFile(bad) as z:
            self.assertEqual(z.testzip(), record)
        # mmap-free plain load works too (no weights_only) and gives the same tensors.
        self.assertTensorsEqual(torch.load(path), sd, "plain torch.load")


# ---------------------------------------------------------------------------- 2

class NestedCheckpointTests(Base):

    def nested(self):
        sd = gpt2_like(seed=7)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
        adam = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
        model(torch.randn(2, 4)).sum().backward()
        adam.step()
        return {
            "model": sd,
            "optimizer": adam.state_dict(),
            "step": 7,
            "cfg": {"lr": 1e-3, "name": "gpt2-tiny", "layers": [2, 16], "shape": (3, 4),
                    "dropout": None, "bias": True, "neg": -5, "nested": {"a": [1, (2, "x")]}},
        }

    def test_nested_pt_to_pt_equal(self):
        ckpt = self.nested()
        self.assertIsInstance(next(iter(ckpt["optimizer"]["state"])), int)
        src = self.p("ckpt.pt")
        torch.save(ckpt, src)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch")
        self.assertEqual(sorted(os.listdir(out)), ["pytorch_model.bin", "reshard-manifest.json"])
        got = self.load(os.path.join(out, "pytorch_model.bin"), weights_only=False)
        self.assertDeepEqual(got, ckpt)
        self.assertEqual(sorted(got["optimizer"]["state"]), [0, 1, 2, 3])
        self.assertIsInstance(got["optimizer"]["param_groups"][0]["betas"], tuple)
        self.assertIsInstance(got["cfg"]["shape"], tuple)
        m = got["model"]
        self.assertEqual(m["transformer.wte.weight"].data_ptr(), m["lm_head.weight"].data_ptr())
        # The loaded optimizer state is usable by torch.
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        adam.load_state_dict(got["optimizer"])

    def test_nested_float_free_loads_weights_only(self):
        sd = gpt2_like(seed=8)
        ckpt = {"model": sd, "step": 7, "meta": {"name": "x", "ids": [1, 2, 3], "t": (4, None),
                                                  "flag": False},
                "buffers": [torch.arange(5), (torch.ones(2, dtype=torch.int8), 3)]}
        src = self.p("ckpt.pt")
        torch.save(ckpt, src)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch")
        got = self.load(os.path.join(out, "pytorch_model.bin"), weights_only=True)
        self.assertDeepEqual(got, ckpt)


# ---------------------------------------------------------------------------- 4

class ShardedTorchOutputTests(Base):

    def test_sharded_output_like_transformers(self):
        sd = gpt2_like(seed=9, layers=3, tied=False)
        sd["x.i64"] = torch.arange(100, dtype=torch.int64)
        sd["x.bf16"] = torch.randn(40, 16).to(torch.bfloat16)
        src = self.p("src.pt")
        torch.save(sd, src)
        out = self.p("out")
        self.ok("consolidate", src, out, "--format", "torch", "--max-shard-size", "6KB")
        files = sorted(os.listdir(out))
        shards = [f for f in files if f.endswith(".bin")]
        n = len(shards)
        self.assertGreater(n, 2, files)
        self.assertEqual(shards, ["pytorch_model-%05d-of-%05d.bin" % (i, n)
                                  for i in range(1, n + 1)])
        self.assertIn("pytorch_model.bin.index.json", files)
        with open(os.path.join(out, "pytorch_model.bin.index.json")) as f:
            index = json.load(f)
        total = sum(t.numel() * t.element_size() for t in sd.values())
        self.assertEqual(index["metadata"]["total_size"], total)
        self.assertEqual(sorted(index["weight_map"]), sorted(sd))
        self.assertEqual(sorted(set(index["weight_map"].values())), shards)
        # transformers' load_sharded_checkpoint, by hand.
        loaded = {}
        for shard in shards:
            part = self.load(os.path.join(out, shard), weights_only=True)
            for k in part:
                self.assertNotIn(k, loaded, "%s in two shards" % k)
                self.assertEqual(index["weight_map"][k], shard, k)
            shard_bytes = sum(t.numel() * t.element_size() for t in part.values())
            if len(part) > 1:
                self.assertLessEqual(shard_bytes, 6000, shard)
            loaded.update(part)
        self.assertTensorsEqual(loaded, sd, "sharded")


# ---------------------------------------------------------------------------- 5

class MetaseqTests(Base):
    N = 2
    HIDDEN = 16
    FFN = 32
    VOCAB = 24
    POS = 10
    LAYERS = 2

    def full_model(self):
        g = torch.Generator().manual_seed(42)
        h, f = self.HIDDEN, self.FFN

        def r(*shape):
            return torch.randn(*shape, generator=g)
        m = collections.OrderedDict()
        m["decoder.version"] = torch.Tensor([3])
        m["decoder.embed_tokens.weight"] = r(self.VOCAB, h)
        m["decoder.embed_positions.weight"] = r(self.POS + 2, h)
        for i in range(self.LAYERS):
            p = "decoder.layers.%d." % i
            for x in "qkv":  # kept apart here; fused per part below
                m[p + "self_attn.%s_proj.weight" % x] = r(h, h)
                m[p + "self_attn.%s_proj.bias" % x] = r(h)
            m[p + "self_attn.out_proj.weight"] = r(h, h)
            m[p + "self_attn.out_proj.bias"] = r(h)
            m[p + "self_attn_layer_norm.weight"] = r(h)
            m[p + "self_attn_layer_norm.bias"] = r(h)
            m[p + "fc1.weight"] = r(f, h)
            m[p + "fc1.bias"] = r(f)
            m[p + "fc2.weight"] = r(h, f)
            m[p + "fc2.bias"] = r(h)
            m[p + "final_layer_norm.weight"] = r(h)
            m[p + "final_layer_norm.bias"] = r(h)
        m["decoder.layer_norm.weight"] = r(h)
        m["decoder.layer_norm.bias"] = r(h)
        return m

    def part_model(self, full, rank, n):
        """metaseq's layout of part `rank` of `n` (fused qkv)."""
        out = collections.OrderedDict()
        for name, t in full.items():
            if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
                continue
            if ".self_attn.q_proj." in name:
                kind = name.rsplit(".", 1)[1]
                pre = name.split("self_attn.")[0] + "self_attn."
                q, k, v = (full[pre + "%s_proj.%s" % (x, kind)] for x in "qkv")
                out[pre + "qkv_proj." + kind] = torch.cat(
                    [q.chunk(n)[rank], k.chunk(n)[rank], v.chunk(n)[rank]], 0).clone()
            elif "embed_tokens" in name or ".fc1." in name:
                out[name] = t.chunk(n, 0)[rank].clone()
            elif name.endswith("fc2.weight") or name.endswith("out_proj.weight"):
                out[name] = t.chunk(n, 1)[rank].clone()
            else:
                out[name] = t.clone()
        return out

    def extras(self, rank):
        return {
            "cfg": {"model": {"_name": "transformer_lm_megatron", "decoder_embed_dim": 16,
                              "dropout": 0.1, "share_decoder_input_output_embed": True},
                    "distributed_training": {"distributed_world_size": 2,
                                             "model_parallel_size": 2},
                    "common": {"fp16": False}},
            "optimizer_history": [{"criterion_name": "VocabParallelCrossEntropyCriterion",
                                   "optimizer_name": "MemoryEfficientFP16Adam",
                                   "lr_scheduler_state": {"best": None}, "num_updates": 100}],
            "extra_state": {"epoch": 1, "val_loss": 2.5, "rank": rank,
                            "train_iterator": {"epoch": 1, "iterations_in_epoch": 3,
                                               "shuffle": True}},
        }

    def write_parts(self, folder, full, n, extra_tensor=None):
        os.makedirs(folder)
        for rank in range(n):
            ckpt = {"model": self.part_model(full, rank, n)}
            if extra_tensor:
                ckpt["model"][extra_tensor] = torch.ones(4)
            ckpt.update(self.extras(rank))
            torch.save(ckpt, os.path.join(folder, "reshard-model_part-%d.pt" % rank))

    def check_parts(self, folder, full, m):
        files = sorted(f for f in os.listdir(folder) if f.endswith(".pt"))
        self.assertEqual(files, ["model_part-%d.pt" % i for i in range(m)], os.listdir(folder))
        for rank in range(m):
            got = self.load(os.path.join(folder, "model_part-%d.pt" % rank), weights_only=False)
            self.assertEqual(sorted(got), ["cfg", "extra_state", "model", "optimizer_history"])
            want = self.part_model(full, rank, m)
            self.assertEqual(sorted(got["model"]), sorted(want), "part %d names" % rank)
            for name in want:
                self.assertTensorEqual(got["model"][name], want[name],
                                       "part %d/%d %s" % (rank, m, name))
            # Non-tensor entries carried over from part 0.
            self.assertDeepEqual(got["cfg"], self.extras(0)["cfg"], "part %d cfg" % rank)
            self.assertDeepEqual(got["optimizer_history"], self.extras(0)["optimizer_history"])
            self.assertDeepEqual(got["extra_state"], self.extras(0)["extra_state"])

    def test_metaseq_2_to_4_to_1(self):
        full = self.full_model()
        two = self.p("two")
        self.write_parts(two, full, self.N)
        four = self.p("four")
        self.ok("reshard", two, four, "--parts", 4, "--rules", "metaseq", "--format", "torch")
        self.check_parts(four, full, 4)
        one = self.p("one")
        self.ok("reshard", four, one, "--parts", 1, "--rules", "metaseq", "--format", "torch")
        self.check_parts(one, full, 1)

    def test_metaseq_2_to_1_consolidate(self):
        full = self.full_model()
        two = self.p("two")
        self.write_parts(two, full, self.N)
        out = self.p("out")
        self.ok("consolidate", two, out, "--rules", "metaseq", "--format", "torch")
        got = self.load(os.path.join(out, "pytorch_model.bin"), weights_only=False)
        want = self.part_model(full, 0, 1)
        model = got["model"] if "model" in got else got
        names = {k[len("model."):] if k.startswith("model.") else k: v for k, v in model.items()}
        self.assertEqual(sorted(names), sorted(want))
        for name in want:
            self.assertTensorEqual(names[name], want[name], "consolidated %s" % name)
        self.assertIn("model", got, "nesting of the parts not kept: %s" % sorted(got)[:10])
        self.assertDeepEqual(got["cfg"], self.extras(0)["cfg"])
        self.assertDeepEqual(got["extra_state"], self.extras(0)["extra_state"])
        self.assertDeepEqual(got["optimizer_history"], self.extras(0)["optimizer_history"])

    def test_metaseq_unmatched_tensor_exit_3(self):
        full = self.full_model()
        two = self.p("two")
        self.write_parts(two, full, self.N, extra_tensor="decoder.layers.0.adapter.weight")
        out = self.p("out")
        res = self.ctl("reshard", two, out, "--parts", 4, "--rules", "metaseq", "--format",
                       "torch", "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("decoder.layers.0.adapter.weight", res.text, self.describe(res))
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
