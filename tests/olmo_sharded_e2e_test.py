"""End-to-end tests of reshard's OLMo LocalShardedCheckpointer reader (olmo-sharded), real torch.

Run:  /usr/bin/python3 tests/olmo_sharded_e2e_test.py --reshardctl PATH [unittest args]

OLMo's LocalShardedCheckpointer (olmo/checkpoint.py) saves per rank `model/rank{N}.pt`:
{"modules": [{"name": fqn, "handles": [{"flat_param.data": ..., "flat_param._fqns": ...,
"flat_param._shapes": ..., "flat_param._shard_param_infos" (torch >= 2.1) or
"flat_param._shard_indices" + "flat_param._shard_param_offsets" (torch <= 2.0),
"flat_param._shard_numel_padded": ...}]}]}. The flat parameters here are made as FSDP's
FlatParamHandle makes them (the module's parameters flattened and concatenated, padded with
zeros to a multiple of the world size, rank r holding the r-th equal chunk), so parameters span
ranks and the last rank is padded. torch 1.13 has no _ShardParamInfo: a STAND-IN NamedTuple of
the same module path (torch.distributed.fsdp._flat_param) and fields is pickled, as torch 2.1's
is. Outputs are compared element by element with the full state dict through the independent
safetensors reader (tests/st_reference.py).
"""

import collections
import os
import sys
import types
from typing import NamedTuple, Optional

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import st_reference as R  # noqa: E402
from verl_e2e_test import reference  # noqa: E402

import torch  # noqa: E402

RESHARDCTL = None

_MODULE = "torch.distributed.fsdp._flat_param"
sys.modules.setdefault(_MODULE, types.ModuleType(_MODULE))


class _ShardParamInfo(NamedTuple):
    in_shard: bool
    offset_in_shard: Optional[int]
    numel_in_shard: Optional[int]
    intra_param_start_idx: Optional[int]
    intra_param_end_idx: Optional[int]


_ShardParamInfo.__module__ = _MODULE
setattr(sys.modules[_MODULE], "_ShardParamInfo", _ShardParamInfo)


def olmo_model(seed):
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    sd["transformer.wte.weight"] = torch.randn(50, 16, generator=g)
    for i in range(2):
        p = "transformer.blocks.%d." % i
        sd[p + "att_proj.weight"] = torch.randn(48, 16, generator=g)
        sd[p + "attn_norm.weight"] = torch.rand(16, generator=g)
        sd[p + "ff_out.weight"] = torch.randn(16, 33, generator=g)
    sd["transformer.ln_f.weight"] = torch.rand(17, generator=g)
    return sd


# FSDP units: the root ("" holding wte and ln_f) and one per block, as OLMo wraps them.
def fsdp_units(sd):
    units = collections.OrderedDict()
    for name in sd:
        if name.startswith("transformer.blocks."):
            block = ".".join(name.split(".")[:3])
            units.setdefault("_fsdp_wrapped_module." + block, []).append(name)
        else:
            units.setdefault("", []).append(name)
    return units


def flat_shard(sd, names, prefix, world, rank, new_fields=True):
    """One handle of rank `rank`: FlatParamHandle's flat parameter and shard metadata."""
    flat = torch.cat([sd[n].reshape(-1) for n in names])
    chunk = -(-flat.numel() // world)
    padded = torch.cat([flat, torch.zeros(chunk * world - flat.numel(), dtype=flat.dtype)])
    a, b = rank * chunk, (rank + 1) * chunk
    data = padded[a:b].clone()
    handle = {"flat_param.data": data}
    rel = [n[len(prefix) + 1:] if prefix else n for n in names]
    handle["flat_param._fqns"] = tuple(rel)
    handle["flat_param._shapes"] = tuple(sd[n].shape for n in names)
    handle["flat_param._numels"] = tuple(sd[n].numel() for n in names)
    handle["flat_param._shard_numel_padded"] = max(0, b - max(a, flat.numel()))
    infos, offsets, first, last = [], [], None, None
    s = 0
    for i, n in enumerate(names):
        e = s + sd[n].numel()
        lo, hi = max(s, a), min(e, b)
        if lo < hi:
            infos.append(_ShardParamInfo(True, lo - a, hi - lo, lo - s, hi - 1 - s))
            offsets.append((lo - s, hi - 1 - s))
            first = i if first is None else first
            last = i
        else:
            infos.append(_ShardParamInfo(False, None, None, None, None))
        s = e
    if new_fields:
        handle["flat_param._shard_param_infos"] = tuple(infos)
    else:
        handle["flat_param._shard_indices"] = (first, last)
        handle["flat_param._shard_param_offsets"] = offsets
    return handle


def write_olmo_sharded(folder, sd, world, new_fields=True, tamper=None):
    os.makedirs(os.path.join(folder, "model"), exist_ok=True)
    for rank in range(world):
        modules = []
        for unit, names in fsdp_units(sd).items():
            prefix = unit.replace("_fsdp_wrapped_module.", "")
            modules.append({"handles": [flat_shard(sd, names, prefix, world, rank, new_fields)],
                            "name": unit})
        state = {"modules": modules}
        if tamper is not None:
            tamper(rank, state)
        torch.save(state, os.path.join(folder, "model", "rank%d.pt" % rank))
        os.makedirs(os.path.join(folder, "optim"), exist_ok=True)
        torch.save({"state": {}, "param_groups": []},
                   os.path.join(folder, "optim", "rank%d.pt" % rank))
    with open(os.path.join(folder, "metadata.yaml"), "w") as f:
        f.write("world_size: %d\n" % world)
    return folder


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-olmo-sharded"

    def convert(self, *args):
        res = self.ctl(*args, "--no-progress")
        self.assertExit(res, 0)
        return res

    def refused(self, src):
        out = self.p("refused-out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        return res.text.replace(self.tmp, "<tmp>")

    def assert_model(self, sd, out, dtype="keep"):
        got = R.read_folder(out)
        self.assertEqual(sorted(got), sorted(sd))
        for name, full in sd.items():
            diff = R.diff_tensors(R.convert(reference(full), dtype), got[name], nan_any=False)
            self.assertIsNone(diff, "%s: %s" % (name, diff))


class OlmoShardedReadTests(Base):

    def test_three_ranks_span_and_padding(self):
        sd = olmo_model(1)
        # The root unit: wte (800) + ln_f (17) = 817 elements, chunks of 273: wte spans ranks
        # 0-2, ln_f sits on rank 2, whose shard ends with 2 padding zeros.
        h = flat_shard(sd, ["transformer.wte.weight", "transformer.ln_f.weight"], "", 3, 2)
        self.assertEqual(h["flat_param._shard_numel_padded"], 2)
        src = write_olmo_sharded(self.p("step10"), sd, 3)
        out = self.p("out")
        self.convert("consolidate", src, out)
        self.assert_model(sd, out)

    def test_torch20_fields(self):
        sd = olmo_model(2)
        src = write_olmo_sharded(self.p("step10"), sd, 3, new_fields=False)
        out = self.p("out")
        self.convert("consolidate", src, out, "--dtype", "bf16")
        self.assert_model(sd, out, "bf16")

    def test_inspect(self):
        src = write_olmo_sharded(self.p("step10"), olmo_model(3), 3)
        info = self.inspect_json(src)
        self.assertEqual(info["format"], "olmo-sharded")
        self.assertEqual(info["description"], "OLMo LocalShardedCheckpointer (FSDP flat "
                                              "parameters), world size 3, 8 parameters")


class OlmoShardedRefusalTests(Base):

    def test_missing_rank_file(self):
        src = write_olmo_sharded(self.p("step10"), olmo_model(4), 3)
        os.remove(os.path.join(src, "model", "rank1.pt"))
        msg = self.refused(src)
        self.assertIn("<tmp>/step10/model/rank1.pt is missing (2 of the 3 ranks' model files "
                      "are there)", msg)

    def test_truncated_rank_file(self):
        src = write_olmo_sharded(self.p("step10"), olmo_model(5), 3)
        path = os.path.join(src, "model", "rank2.pt")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 50)
        msg = self.refused(src)
        self.assertIn("<tmp>/step10/model/rank2.pt", msg)

    def test_shards_not_tiling(self):
        def tamper(rank, state):
            if rank != 1:
                return
            h = state["modules"][0]["handles"][0]
            infos = list(h["flat_param._shard_param_infos"])
            i = infos[0]  # wte on rank 1: elements [273, 546) -> claim [274, 547)
            infos[0] = i._replace(intra_param_start_idx=i.intra_param_start_idx + 1,
                                  intra_param_end_idx=i.intra_param_end_idx + 1)
            h["flat_param._shard_param_infos"] = tuple(infos)
        src = write_olmo_sharded(self.p("step10"), olmo_model(6), 3, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/step10: parameter \"transformer.wte.weight\" ([50, 16], 800 "
                      "elements): elements [273, 274) are in no rank's shard (after [0, 273) "
                      "from <tmp>/step10/model/rank0.pt (offset_in_shard 0) the next is "
                      "[274, 547) from <tmp>/step10/model/rank1.pt (offset_in_shard 0))", msg)

    def test_disallowed_global(self):
        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))

        def tamper(rank, state):
            if rank == 0:
                state["modules"][0]["handles"][0]["flat_param._numels"] = Evil()
        src = write_olmo_sharded(self.p("step10"), olmo_model(7), 3, tamper=tamper)
        msg = self.refused(src)
        self.assertIn("<tmp>/step10/model/rank0.pt: entry \"modules\" holds the Python global "
                      "posix.system", msg)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
