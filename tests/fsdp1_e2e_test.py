"""End-to-end tests of reshard's FSDP1 SHARDED_STATE_DICT reader (fsdp1-sharded), real torch.

Run:  /usr/bin/python3 tests/fsdp1_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]

Under StateDictType.SHARDED_STATE_DICT, FSDP1 (torch/distributed/fsdp/_state_dict_utils.py,
_shard_utils._create_chunk_sharded_tensor) gives every parameter as a ShardedTensor: the tensor
cut along dim 0 as torch.chunk cuts it over the W ranks, rank r holding chunk r as its one local
Shard (none when torch.chunk leaves it nothing), and ShardedTensorMetadata listing every
chunk's ShardMetadata(shard_offsets, shard_sizes, placement "rank:r/cuda:r"). Buffers stay plain
tensors that every rank saves. Each rank saves `torch.save(model.state_dict(), "...rank{r}.pt")`.

Debian's torch 1.13 has ShardedTensor, but its torch.distributed._shard package does not import
under Python 3.11 (a dataclass default), and ShardedTensor.__getstate__ needs a process group.
The fixtures therefore pickle STAND-IN classes registered under torch's own module paths
(torch.distributed._shard.sharded_tensor.api.ShardedTensor and its nested ProcessGroupState,
...sharded_tensor.shard.Shard, ..._shard.metadata.ShardMetadata, ...sharded_tensor.metadata.
ShardedTensorMetadata / TensorProperties / MEM_FORMAT_ENCODING, ...sharding_spec.
chunk_sharding_spec.ChunkShardingSpec) with torch's fields, and torch 1.13's real
torch.distributed.remote_device._remote_device. Their pickles are what torch 2.x writes:
Tensor.__reduce_ex__ gives _rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor,
(ShardedTensor, dtype, size, stride, 0, layout, device, requires_grad), state) with state =
ShardedTensor.__getstate__() = (local_shards, metadata, ProcessGroupState(local_rank,
global_rank, local_world_size, global_world_size), sharding_spec, init_rrefs); protocol 2
writes the nested ProcessGroupState as getattr(ShardedTensor, "ProcessGroupState"). The local
tensors are real torch tensors written by real torch.save.

reshard's outputs are read by the independent reader of tests/st_reference.py and compared
element by element with the full state dict. Broken saves must exit 3 naming the file, no OUT.
"""

import collections
import dataclasses
import enum
import os
import sys
import types
from typing import Any, List, NamedTuple

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import verl_e2e_test  # noqa: E402
from verl_e2e_test import row_major_stride  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
from torch.distributed.remote_device import _remote_device  # noqa: E402

RESHARDCTL = None

# ------------------------------------------------------------------ stand-ins of torch's classes

_API = "torch.distributed._shard.sharded_tensor.api"
_SHARD = "torch.distributed._shard.sharded_tensor.shard"
_SHARD_METADATA = "torch.distributed._shard.metadata"
_ST_METADATA = "torch.distributed._shard.sharded_tensor.metadata"
_SPEC = "torch.distributed._shard.sharding_spec.chunk_sharding_spec"


def _place(cls, module, qualname):
    if module not in sys.modules:
        sys.modules[module] = types.ModuleType(module)
    cls.__module__ = module
    cls.__qualname__ = qualname
    cls.__name__ = qualname.split(".")[-1]
    if "." not in qualname:
        setattr(sys.modules[module], qualname, cls)
    return cls


class MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclasses.dataclass
class TensorProperties:
    dtype: Any
    layout: Any = torch.strided
    requires_grad: bool = False
    pin_memory: bool = False

    def __getstate__(self):  # torch's: memory_format as its encoding
        return (self.dtype, self.layout, self.requires_grad,
                MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)


class ShardMetadata:
    __slots__ = ["shard_offsets", "shard_sizes", "placement"]

    def __init__(self, shard_offsets, shard_sizes, placement):
        self.shard_offsets = shard_offsets
        self.shard_sizes = shard_sizes
        self.placement = _remote_device(placement)


@dataclasses.dataclass
class ShardedTensorMetadata:
    shards_metadata: List[Any]
    size: Any
    tensor_properties: Any


@dataclasses.dataclass
class Shard:
    tensor: Any
    metadata: Any


@dataclasses.dataclass
class ChunkShardingSpec:
    dim: int
    placements: List[Any]


class ShardedTensor:
    class ProcessGroupState(NamedTuple):
        local_rank: int
        global_rank: int
        local_world_size: int
        global_world_size: int

    def __init__(self, local_shards, metadata, rank, world):
        self.local_shards = local_shards
        self.metadata = metadata
        self.rank = rank
        self.world = world

    def __reduce_ex__(self, proto):
        size = self.metadata.size
        args = (ShardedTensor, self.metadata.tensor_properties.dtype, size,
                row_major_stride(size), 0, torch.strided, torch.device("cuda", self.rank), False)
        pg = ShardedTensor.ProcessGroupState(self.rank, self.rank, self.world, self.world)
        spec = ChunkShardingSpec(0, [m.placement for m in self.metadata.shards_metadata])
        state = (self.local_shards, self.metadata, pg, spec, False)
        return (torch._tensor._rebuild_from_type_v2,
                (torch._utils._rebuild_wrapper_subclass, ShardedTensor, args, state))


_place(MEM_FORMAT_ENCODING, _ST_METADATA, "MEM_FORMAT_ENCODING")
_place(TensorProperties, _ST_METADATA, "TensorProperties")
_place(ShardedTensorMetadata, _ST_METADATA, "ShardedTensorMetadata")
_place(ShardMetadata, _SHARD_METADATA, "ShardMetadata")
_place(Shard, _SHARD, "Shard")
_place(ChunkShardingSpec, _SPEC, "ChunkShardingSpec")
_place(ShardedTensor, _API, "ShardedTensor")
_place(ShardedTensor.ProcessGroupState, _API, "ShardedTensor.ProcessGroupState")


def chunk_sharded(full, rank, world):
    """_create_chunk_sharded_tensor: torch.chunk along dim 0, every chunk in the metadata, this
    rank's (if torch.chunk left it one) as its local shard."""
    chunks = list(torch.chunk(full, world))
    metas, offset = [], 0
    for r, c in enumerate(chunks):
        metas.append(ShardMetadata([offset] + [0] * (full.dim() - 1), list(c.shape),
                                   "rank:%d/cuda:%d" % (r, r)))
        offset += c.shape[0]
    local = [Shard(chunks[rank].clone(), metas[rank])] if rank < len(chunks) else []
    meta = ShardedTensorMetadata(metas, full.size(), TensorProperties(full.dtype))
    return ShardedTensor(local, meta, rank, world)


def fsdp1_model(seed):
    """Rows that do not divide by 3: embed (10 rows: 4, 4, 2), k_proj (2 rows: ranks 0 and 1,
    rank 2 holds nothing), a bf16 weight, a 1-d norm of 7 (3, 3, 1) and a plain buffer."""
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    sd["model.embed_tokens.weight"] = torch.randn(10, 8, generator=g)
    sd["model.layers.0.self_attn.k_proj.weight"] = torch.randn(2, 8, generator=g)
    sd["model.layers.0.mlp.up_proj.weight"] = (torch.randn(9, 8, generator=g) * 5).to(
        torch.bfloat16)
    sd["model.norm.weight"] = torch.rand(7, generator=g)
    sd["model.rotary_emb.inv_freq"] = torch.rand(4, generator=g)  # a buffer: plain, every rank
    return sd


BUFFERS = {"model.rotary_emb.inv_freq"}


def write_fsdp1(folder, sd, world, prefix="model_rank", tamper=None):
    """Every rank's torch.save of its sharded state dict; tamper(rank, state_dict) may change a
    rank's state dict before it is saved."""
    os.makedirs(folder, exist_ok=True)
    for rank in range(world):
        local = collections.OrderedDict()
        for name, full in sd.items():
            local[name] = full.clone() if name in BUFFERS else chunk_sharded(full, rank, world)
        if tamper is not None:
            tamper(rank, local)
        torch.save(local, os.path.join(folder, "%s%d.pt" % (prefix, rank)))
    return folder


class Base(verl_e2e_test.Base):
    """verl's: convert, refused (exit 3, no OUT), assert_model (element by element)."""
    TMP_PREFIX = "reshard-fsdp1"


class Fsdp1ReadTests(Base):

    def test_three_ranks_span_and_short_last(self):
        sd = fsdp1_model(1)
        # k_proj's 2 rows span ranks 0 and 1; rank 2's list of local shards is empty.
        self.assertEqual(chunk_sharded(sd["model.layers.0.self_attn.k_proj.weight"], 2, 3)
                         .local_shards, [])
        self.assertEqual(list(chunk_sharded(sd["model.norm.weight"], 2, 3).local_shards[0]
                              .tensor.shape), [1])
        src = write_fsdp1(self.p("ckpt"), sd, 3)
        out = self.p("out")
        self.convert("consolidate", src, out)
        self.assert_model(sd, out)
        self.ok("verify", src, out)

    def test_bf16_and_four_ranks(self):
        sd = fsdp1_model(2)
        src = write_fsdp1(self.p("ckpt"), sd, 4, prefix="rank")
        out = self.p("out")
        self.convert("consolidate", src, out, "--dtype", "bf16")
        self.assert_model(sd, out, "bf16")

    def test_inspect_names_fsdp1_and_world_size(self):
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(3), 3)
        info = self.inspect_json(src)
        self.assertEqual(info["format"], "fsdp1-sharded")
        self.assertEqual(info["description"], "FSDP1 sharded state dict, world size 3, 5 tensors, "
                                              "2 replicated copies read once")

    def test_bounded_memory(self):
        g = torch.Generator().manual_seed(8)
        sd = collections.OrderedDict(
            ("w%d" % i, torch.randn(3001, 4096, generator=g)) for i in range(6))
        src = write_fsdp1(self.p("ckpt"), sd, 3)
        total = sum(t.numel() * 4 for t in sd.values())
        rss = harness.assert_bounded_rss(
            self, [RESHARDCTL, "consolidate", src, self.p("out"), "--no-progress"], total)
        self.assertLess(rss, 64 << 20)
        self.assert_model(sd, self.p("out"))


class Fsdp1RefusalTests(Base):

    def test_missing_rank_file(self):
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(4), 3)
        os.remove(os.path.join(src, "model_rank1.pt"))
        msg = self.refused(src)
        self.assertIn("<tmp>/ckpt/model_rank1.pt is missing (2 of the 3 ranks' files are there)",
                      msg)

    def test_shards_that_do_not_tile(self):
        def tamper(rank, sd):
            # Every rank's metadata places rank 1's 4 rows at [3, 7): rows 3 overlap, 7 is in
            # no shard.
            sd["model.embed_tokens.weight"].metadata.shards_metadata[1].shard_offsets = [3, 0]
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(5), 3, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/ckpt: tensor \"model.embed_tokens.weight\" (global shape [10, 8]): "
                      "no rank's file holds elements [7, 8) x [0, 8)", msg)

    def test_metadata_of_two_saves(self):
        def tamper(rank, sd):
            # Rank 1's file alone places its rows at [3, 7).
            if rank == 1:
                st = sd["model.embed_tokens.weight"]
                st.local_shards[0].metadata.shard_offsets = [3, 0]
                st.metadata.shards_metadata[1].shard_offsets = [3, 0]
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(5), 3, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/ckpt/model_rank1.pt: tensor \"model.embed_tokens.weight\": its "
                      "ShardedTensorMetadata lists shards [0, 4) x [0, 8) on rank 0, "
                      "[3, 7) x [0, 8) on rank 1, [8, 10) x [0, 8) on rank 2, rank 0's file "
                      "[0, 4) x [0, 8) on rank 0, [4, 8) x [0, 8) on rank 1, [8, 10) x [0, 8) "
                      "on rank 2: files of two different saves are mixed", msg)

    def test_two_saves_mixed(self):
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(6), 3)
        write_fsdp1(self.p("other"), fsdp1_model(6), 2)
        os.replace(os.path.join(self.p("other"), "model_rank1.pt"),
                   os.path.join(src, "model_rank1.pt"))
        msg = self.refused(src)
        self.assertIn("<tmp>/ckpt/model_rank1.pt: saved by rank 1 of world size 2, but "
                      "<tmp>/ckpt/model_rank0.pt by rank 0 of 3: files of two different saves "
                      "are mixed", msg)

    def test_disallowed_global(self):
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))

        def tamper(rank, sd):
            if rank == 2:
                sd["model.norm.weight"].local_shards[0].metadata.placement = Evil()
        src = write_fsdp1(self.p("ckpt"), fsdp1_model(7), 3, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/ckpt/model_rank2.pt: entry \"model.norm.weight\" holds the Python "
                      "global posix.system", msg)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
