"""End-to-end tests of reshard's verl FSDP reader (verl-fsdp) against real torch.

Run:  /usr/bin/python3 tests/verl_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]

verl (verl/utils/checkpoint/fsdp_checkpoint_manager.py) saves, per rank r of world size W,
`model_world_size_{W}_rank_{r}.pt`: torch.save of the rank's sharded state dict, whose values
are DTensors, beside `fsdp_config.json` and a `huggingface/` folder (config.json, tokenizer).

Debian's torch 1.13 has no DTensor. The fixtures therefore pickle STAND-IN classes registered
under torch's own module paths (torch.distributed.tensor.DTensor, ..._dtensor_spec.DTensorSpec,
...placement_types.Shard, device_mesh.DeviceMesh for torch >= 2.4; torch.distributed._tensor.*
for torch 2.0-2.3) whose pickles are what torch 2.x writes: Tensor.__reduce_ex__ (torch/_tensor.py)
gives _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (DTensor, dtype, size, stride,
storage_offset, layout, device, requires_grad), state) with state = (None, {"_local_tensor":
..., "_spec": ...}) (DTensor's __slots__, Python 3.11's object.__getstate__); DTensorSpec,
Shard and Replicate are dataclasses, TensorMeta a NamedTuple. The local tensors are real torch
tensors written by real torch.save, cut from a full state dict as torch's Shard._split_tensor
cuts them (torch.chunk), the last ranks' as views of padded storages as FSDP2 keeps them.

reshard's outputs are read by the independent reader of tests/st_reference.py and compared
element by element (bit for bit) with the full state dict, converted to numpy independently
(bf16: round to nearest even in numpy). Broken saves must exit 3 naming the file, no OUT.
"""

import collections
import dataclasses
import json
import os
import pickle
import sys
import types
from typing import Any, NamedTuple, Optional, Tuple

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import st_reference as R  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip

RESHARDCTL = None


# ------------------------------------------------------------------ stand-ins for torch 2.x

def _module(name):
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    return sys.modules[name]


def _place(cls, module, name):
    cls.__module__ = module
    cls.__qualname__ = name
    cls.__name__ = name
    setattr(_module(module), name, cls)
    return cls


def _stand_ins(modules):
    """Stand-in classes pickled under `modules` (dtensor, spec, placements, mesh paths)."""

    class DeviceMesh:
        def __init__(self, device_type, mesh, names):
            self.device_type = device_type
            self.mesh = mesh
            self.mesh_dim_names = names

    @dataclasses.dataclass(frozen=True)
    class Shard:
        dim: int

    @dataclasses.dataclass(frozen=True)
    class Replicate:
        pass

    @dataclasses.dataclass(frozen=True)
    class Partial:
        reduce_op: str = "sum"

    class TensorMeta(NamedTuple):
        shape: Any
        stride: Tuple[int, ...]
        dtype: Any

    @dataclasses.dataclass
    class DTensorSpec:
        mesh: Any
        placements: Tuple[Any, ...]
        tensor_meta: Optional[Any] = None

    class DTensor:
        __slots__ = ["_local_tensor", "_spec", "_rank"]

        def __init__(self, local, spec, rank):
            self._local_tensor = local
            self._spec = spec
            self._rank = rank

        def __reduce_ex__(self, proto):
            meta = self._spec.tensor_meta
            size = torch.Size(meta.shape)
            args = (DTensor, meta.dtype, size, meta.stride, 0, torch.strided,
                    torch.device("cuda", self._rank), False)
            state = (None, {"_local_tensor": self._local_tensor, "_spec": self._spec})
            return (torch._tensor._rebuild_from_type_v2,
                    (torch._utils._rebuild_wrapper_subclass, DTensor, args, state))

    ns = types.SimpleNamespace()
    ns.DTensor = _place(DTensor, modules["dtensor"], "DTensor")
    ns.DTensorSpec = _place(DTensorSpec, modules["spec"], "DTensorSpec")
    ns.TensorMeta = _place(TensorMeta, modules["spec"], "TensorMeta")
    ns.Shard = _place(Shard, modules["placements"], "Shard")
    ns.Replicate = _place(Replicate, modules["placements"], "Replicate")
    ns.Partial = _place(Partial, modules["placements"], "Partial")
    ns.DeviceMesh = _place(DeviceMesh, modules["mesh"], "DeviceMesh")
    return ns


TORCH_24 = _stand_ins({"dtensor": "torch.distributed.tensor",
                       "spec": "torch.distributed.tensor._dtensor_spec",
                       "placements": "torch.distributed.tensor.placement_types",
                       "mesh": "torch.distributed.device_mesh"})
TORCH_20 = _stand_ins({"dtensor": "torch.distributed._tensor.api",
                       "spec": "torch.distributed._tensor.placement_types",
                       "placements": "torch.distributed._tensor.placement_types",
                       "mesh": "torch.distributed._tensor.device_mesh"})


def row_major_stride(shape):
    stride, acc = [], 1
    for extent in reversed(shape):
        stride.append(acc)
        acc *= extent
    return tuple(reversed(stride))


def local_shard(full, placements, mesh_shape, rank):
    """The rank's local tensor as torch's Shard._split_tensor cuts it (torch.chunk per mesh
    dimension, in order, ranks on the mesh in row-major order). A chunk shorter than the
    others is a view of a storage padded to the full chunk, as FSDP2's sharded parameters are."""
    coord, rest = [], rank
    for extent in reversed(mesh_shape):
        coord.append(rest % extent)
        rest //= extent
    coord.reverse()
    t, pad_to = full, None
    for i, p in enumerate(placements):
        if not hasattr(p, "dim"):
            continue
        chunk = -(-t.shape[p.dim] // mesh_shape[i])
        chunks = list(torch.chunk(t, mesh_shape[i], dim=p.dim))
        t = chunks[coord[i]] if coord[i] < len(chunks) else t.narrow(p.dim, 0, 0)
        pad_to = chunk if p.dim == 0 and 0 < t.shape[0] < chunk else None
    t = t.clone()
    if pad_to is not None:
        buf = torch.zeros((pad_to,) + tuple(t.shape[1:]), dtype=t.dtype)
        buf[: t.shape[0]] = t
        t = buf[: t.shape[0]]
    return t


def verl_model(seed):
    """A small Llama-like state dict with rows that do not divide by 2 or 4 (torch.chunk leaves
    the last ranks shorter or empty), a 1-d norm, a bf16 tensor and a replicated buffer."""
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    sd["model.embed_tokens.weight"] = torch.randn(50, 16, generator=g)
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.randn(16, 16, generator=g)
    sd["model.layers.0.self_attn.k_proj.weight"] = torch.randn(5, 16, generator=g)
    sd["model.layers.0.mlp.gate_proj.weight"] = (torch.randn(3, 16, generator=g) * 7).to(
        torch.bfloat16)
    sd["model.layers.0.input_layernorm.weight"] = torch.rand(16, generator=g)
    sd["model.norm.weight"] = torch.rand(17, generator=g)
    sd["lm_head.weight"] = torch.randn(50, 16, generator=g)
    sd["model.rotary_emb.inv_freq"] = torch.rand(8, generator=g)  # Replicate()
    return sd


REPLICATED = {"model.rotary_emb.inv_freq"}


def write_verl(folder, sd, world, ns=TORCH_24, mesh_shape=None, hf=True, placements_of=None,
               tamper=None):
    """verl's actor folder for `sd` saved by `world` ranks; tamper(rank, state_dict) may change
    a rank's state dict before it is saved (the stand-ins cannot be torch.load-ed)."""
    os.makedirs(folder, exist_ok=True)
    mesh_shape = mesh_shape or (world,)
    mesh = ns.DeviceMesh("cuda", torch.arange(world).reshape(mesh_shape),
                         ("fsdp",) if len(mesh_shape) == 1 else ("ddp", "fsdp"))
    for rank in range(world):
        local = collections.OrderedDict()
        for name, full in sd.items():
            if placements_of is not None:
                placements = placements_of(name, ns)
            elif name in REPLICATED:
                placements = tuple(ns.Replicate() for _ in mesh_shape)
            else:
                placements = tuple([ns.Replicate()] * (len(mesh_shape) - 1) + [ns.Shard(0)])
            meta = ns.TensorMeta(full.shape, row_major_stride(full.shape), full.dtype)
            spec = ns.DTensorSpec(mesh, placements, meta)
            shard = local_shard(full, placements, mesh_shape, rank)
            local[name] = ns.DTensor(shard, spec, rank)
        if tamper is not None:
            tamper(rank, local)
        torch.save(local, os.path.join(folder, "model_world_size_%d_rank_%d.pt" % (world, rank)))
    with open(os.path.join(folder, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world}, f)
    if hf:
        os.makedirs(os.path.join(folder, "huggingface"), exist_ok=True)
        with open(os.path.join(folder, "huggingface", "config.json"), "w") as f:
            json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 16,
                       "torch_dtype": "float32"}, f)
        with open(os.path.join(folder, "huggingface", "tokenizer.json"), "w") as f:
            f.write('{"version": "1.0"}')
    return folder


def reference(t):
    """A torch tensor as an st_reference Tensor, converted with numpy only."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return R.Tensor("BF16", t.view(torch.int16).numpy().view(np.uint16).copy())
    tag = {torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}[t.dtype]
    return R.Tensor(tag, t.numpy().copy())


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-verl"

    def convert(self, *args):
        res = self.ctl(*args, "--no-progress")
        self.assertExit(res, 0)
        return res

    def refused(self, src, code=3):
        out = self.p("refused-out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, code)
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        return res.text.replace(self.tmp, "<tmp>")

    def assert_model(self, sd, out, dtype="keep"):
        got = R.read_folder(out)
        self.assertEqual(list(sorted(got)), list(sorted(sd)))
        for name, full in sd.items():
            want = R.convert(reference(full), dtype)
            diff = R.diff_tensors(want, got[name], nan_any=False)
            self.assertIsNone(diff, "%s: %s" % (name, diff))


class VerlReadTests(Base):

    def test_world_size_2_torch20_module_paths(self):
        sd = verl_model(1)
        src = write_verl(self.p("actor"), sd, 2, ns=TORCH_20)
        out = self.p("out")
        self.convert("consolidate", src, out)
        self.assert_model(sd, out)

    def test_world_size_4_empty_last_shards(self):
        sd = verl_model(2)
        src = write_verl(self.p("actor"), sd, 4)
        # torch.chunk: 3 rows over 4 ranks leave rank 3 nothing; 5 rows give 2, 2, 1, 0.
        gate = sd["model.layers.0.mlp.gate_proj.weight"]
        self.assertEqual(tuple(local_shard(gate, (TORCH_24.Shard(0),), (4,), 3).shape), (0, 16))
        out = self.p("out")
        self.convert("consolidate", src, out)
        self.assert_model(sd, out)

    def test_hsdp_mesh_2x2(self):
        sd = verl_model(3)
        src = write_verl(self.p("actor"), sd, 4, mesh_shape=(2, 2))
        out = self.p("out")
        self.convert("consolidate", src, out)
        self.assert_model(sd, out)
        self.ok("verify", src, out)

    def test_bf16_round_to_nearest_even(self):
        sd = verl_model(4)
        # Ties and near-ties of bf16 rounding in the first row of a tensor.
        sd["model.embed_tokens.weight"][0, :4] = torch.tensor(
            np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F808001], dtype=np.uint32)
            .view(np.float32))
        src = write_verl(self.p("actor"), sd, 4)
        out = self.p("out")
        self.convert("consolidate", src, out, "--dtype", "bf16")
        self.assert_model(sd, out, "bf16")
        got = R.read_folder(out)["model.embed_tokens.weight"].array[0, :4]
        self.assertEqual([int(x) for x in got], [0x3F80, 0x3F82, 0x3F81, 0x3F81])

    def test_inspect_names_verl_and_world_size(self):
        src = write_verl(self.p("actor"), verl_model(5), 4)
        info = self.inspect_json(src)
        self.assertEqual(info["format"], "verl-fsdp")
        self.assertEqual(info["description"],
                         "verl FSDP, world size 4, 8 tensors, 3 replicated copies read once")

    def test_huggingface_files_are_carried(self):
        src = write_verl(self.p("actor"), verl_model(6), 2)
        out = self.p("out")
        self.convert("consolidate", src, out, "--dtype", "bf16")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        with open(os.path.join(out, "tokenizer.json")) as f:
            self.assertEqual(f.read(), '{"version": "1.0"}')

    def test_bounded_memory(self):
        g = torch.Generator().manual_seed(7)
        sd = collections.OrderedDict(
            ("w%d" % i, torch.randn(3001, 4096, generator=g)) for i in range(6))
        src = write_verl(self.p("actor"), sd, 4, hf=False)
        total = sum(t.numel() * 4 for t in sd.values())
        rss = harness.assert_bounded_rss(
            self, [RESHARDCTL, "consolidate", src, self.p("out"), "--no-progress"], total)
        self.assertLess(rss, 64 << 20)
        self.assert_model(sd, self.p("out"))


class VerlRefusalTests(Base):

    def save(self, world=2, **kw):
        return write_verl(self.p("actor"), verl_model(11), world, **kw)

    def test_missing_rank_file(self):
        src = self.save(4)
        os.remove(os.path.join(src, "model_world_size_4_rank_2.pt"))
        msg = self.refused(src)
        self.assertIn("<tmp>/actor/model_world_size_4_rank_2.pt is missing", msg)

    def test_truncated_rank_file(self):
        src = self.save(2)
        path = os.path.join(src, "model_world_size_2_rank_1.pt")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 100)
        msg = self.refused(src)
        self.assertIn("<tmp>/actor/model_world_size_2_rank_1.pt", msg)

    def test_disallowed_global(self):
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))

        def tamper(rank, sd):
            if rank == 1:
                sd["extra"] = Evil()
        src = self.save(2, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/actor/model_world_size_2_rank_1.pt: entry \"extra\" holds the "
                      "Python global posix.system", msg)

    def test_partial_placement(self):
        def placements(name, ns):
            return (ns.Partial(),) if name == "model.norm.weight" else (ns.Shard(0),)
        src = self.save(2, placements_of=placements)
        msg = self.refused(src)
        self.assertIn("model_world_size_2_rank_0.pt: tensor \"model.norm.weight\"", msg)

    def test_local_tensor_of_the_wrong_shape(self):
        def tamper(rank, sd):
            # Rank 1 of 2 holds rows [25, 50) of the embedding: give it 24.
            if rank == 1:
                d = sd["model.embed_tokens.weight"]
                d._local_tensor = d._local_tensor[:24].clone()
        src = self.save(2, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("model_world_size_2_rank_1.pt: tensor \"model.embed_tokens.weight\" "
                      "(global shape [50, 16], Shard(0)): rank 1 of 2 holds elements "
                      "[25, 50) x [0, 16) of shape [25, 16], but its local tensor", msg)

    def test_shards_of_two_world_sizes(self):
        src = self.save(2)
        write_verl(self.p("other"), verl_model(11), 4)
        os.rename(os.path.join(self.p("other"), "model_world_size_4_rank_3.pt"),
                  os.path.join(src, "model_world_size_4_rank_3.pt"))
        msg = self.refused(src)
        self.assertIn("name different world sizes", msg)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
