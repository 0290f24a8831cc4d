"""End-to-end tests of DeepSpeed universal checkpoints made from Megatron-DeepSpeed TP x PP
pipeline checkpoints with ZeRO-1 optimizer files (`reshardctl consolidate IN OUT --format
deepspeed-universal`), against real PyTorch.

tests/fixtures/megatron_fixture.py writes the checkpoints (real ZeRO-1 / BF16_Optimizer
partitions of every (pp, tp, dp) rank, from known fp32 master weights and moments that differ
from the 16-bit layer files). The expected universal tensors are merged here, in Python, from
the fixture's per-rank slices with ds_to_universal's pattern table (independent of reshard);
every zero/<param>/*.pt is read with torch.load and compared element by element, then sliced
back the way DeepSpeed's load_hp_checkpoint_state slices it for a new TP and compared with the
fixture's slices for that TP.

Run:  /usr/bin/python3 tests/megatron_universal_e2e_test.py --reshardctl PATH [unittest args]
"""

import filecmp
import os
import re
import sys
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import megatron_fixture as mf  # noqa: E402
import zero_fixture as zf  # noqa: E402  -- DeepSpeed's SubparamShape (or its stand-in)

STEP = 100
STATES = ("fp32", "exp_avg", "exp_avg_sq")
WHICH = {"fp32": "master", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


def load(path):
    return torch.load(path, map_location="cpu")


# --- ds_to_universal's merge (deepspeed/checkpoint/ds_to_universal.py, merge_tp_slices) ------

def ds_merge(name, slices, info):
    """The dict ds_to_universal saves for one state of parameter `name` from its TP slices."""
    def matched(key):
        hits = [p for p in info.get(key, []) if re.match(p, name)]
        assert len(hits) <= 1, (name, hits)
        return bool(hits)
    def matched_sub_params():
        for entry in info.get("parameter_with_sub_params", []):
            shape = zf.SubparamShape(**entry)
            if any(re.match(p, name) for p in shape.patterns):
                return shape
        return None
    out = {}
    sub_param_shape = matched_sub_params()
    if matched("tp_replicated_parameter_patterns"):
        assert all(torch.equal(slices[0], s) for s in slices[1:]), name
        param = slices[0]
    elif matched("parameter_to_average_patterns"):
        param = sum(slices) / len(slices)
    elif matched("parameter_with_2_sub_params_cat_dim_0"):
        chunks = [torch.chunk(s, 2, dim=0) for s in slices]
        param = torch.cat([torch.cat([c[0] for c in chunks], 0),
                           torch.cat([c[1] for c in chunks], 0)], 0)
        out["cat_dim"] = 0
        out["param_n_sub_params"] = 2
    elif sub_param_shape:
        # Each slice holds its share of every sub-param along partition_dim, in order; the
        # merge is the sub-params one after the other, each its rank pieces concatenated.
        dim = sub_param_shape.partition_dim
        sizes = sub_param_shape.shape[dim]
        sizes = sizes if isinstance(sizes, tuple) else (sizes,)
        whole = [sum(d) if isinstance(d, tuple) else d for d in sub_param_shape.shape]
        tp = len(slices)
        slices = [s.view([d // tp if i == dim else d for i, d in enumerate(whole)])
                  for s in slices]
        merged, offset = [], 0
        for size in sizes:
            merged.append(torch.cat([s.narrow(dim, offset, size // tp) for s in slices], dim))
            offset += size // tp
        param = torch.cat(merged, dim)
        out["sub_param_shape"] = sub_param_shape
    else:
        cat_dim = 1 if matched("parameter_with_row_parallelism_patterns") else 0
        param = torch.cat(slices, dim=cat_dim)
        out["cat_dim"] = cat_dim
    if matched("vocabulary_parameter_patterns"):
        param = param[:info["original_vocab_size"], :]
        out["vocab_tensor"] = True
    out["param"] = param
    return out


# --- DeepSpeed's load_hp_checkpoint_state (deepspeed/checkpoint/universal_checkpoint.py) ------

def load_hp_slice(saved, shape, tp_rank, tp_world):
    """The TP slice of shape `shape` that rank tp_rank of tp_world loads from a saved dict."""
    full = saved["param"]
    if tuple(full.shape) == tuple(shape):  # replicated (or averaged): a copy
        tp_rank, tp_world = 0, 1
    if saved.get("vocab_tensor", False):
        padded = shape[0] * tp_world
        assert padded >= full.shape[0]
        if padded > full.shape[0]:
            full = torch.nn.functional.pad(full, (0, 0, 0, padded - full.shape[0]), "constant", 0)
    assert full.numel() == tp_world * torch.Size(shape).numel(), (full.shape, shape)
    dim = saved.get("cat_dim", 0)
    n_sub = saved.get("param_n_sub_params", 1)
    sub_param_shape = saved.get("sub_param_shape", None)
    if sub_param_shape:
        # Each sub-param's tp_rank-th chunk along partition_dim, concatenated.
        dim = sub_param_shape.partition_dim
        sizes = sub_param_shape.shape[dim]
        sizes = sizes if isinstance(sizes, tuple) else (sizes,)
        full = full.view([sum(d) if isinstance(d, tuple) else d for d in sub_param_shape.shape])
        chunks, offset = [], 0
        for size in sizes:
            chunks.append(full.narrow(dim, offset, size).chunk(tp_world, dim=dim)[tp_rank])
            offset += size
        return torch.cat(chunks, dim)
    if n_sub > 1:
        subs = full.chunk(n_sub, dim=dim)
        return torch.cat([s.chunk(tp_world, dim=dim)[tp_rank] for s in subs], dim=dim)
    return full.chunk(tp_world, dim)[tp_rank]


# --- The fixture's known slices ---------------------------------------------------------------

def rank_slices(model, tp, pp, which):
    """{module name: [TP slice per tp rank]} of state `which`, taking pipeline-replicated
    parameters from the first stage holding them (ds_to_universal skips the others)."""
    state = mf.PipeZeroState(model)
    out = {}
    for p in range(pp):
        for t in range(tp):
            for group in mf.pipe_zero_groups(model, state, p, t, tp, pp, which):
                for name, tensor in group.items():
                    slices = out.setdefault(name, {})
                    if p > 0 and t in slices:
                        # The tied embedding again on the last stage: the same values.
                        assert torch.equal(slices[t], tensor), name
                        continue
                    slices[t] = tensor
    return {name: [slices[t] for t in range(tp)] for name, slices in out.items()}


def repadded(model, state, new_tp):
    """`state` (a logical GPT) as a run with new_tp would hold it: the vocabulary (embedding and
    an untied output layer) re-padded with zero rows for new_tp (what DeepSpeed's loader fills
    the padding with)."""
    target = mf.GPT(layers=model.layers, hidden=model.hidden, heads=model.heads, ffn=model.ffn,
                    vocab=model.vocab, divisible_by=model.divisible_by, train_tp=new_tp,
                    seq=model.seq, swiglu=model.swiglu, tied=model.tied)
    out = mf.map_gpt(state, lambda x: x)

    def pad(rows):
        padded = torch.zeros(target.padded_vocab, model.hidden)
        padded[:model.vocab] = rows[:model.vocab]
        return padded
    out.embed = pad(state.embed)
    if not model.tied:
        out.output = pad(state.output)
    out.padded_vocab = target.padded_vocab
    return target, out


class MegatronUniversalTests(harness.CliTestCase):
    TMP_PREFIX = "reshard-megatron-universal"
    TIMEOUT = 180

    def convert(self, model, tp, pp, dp, bf16=False):
        name = "tp%d-pp%d-dp%d-%s%s%s" % (tp, pp, dp, "swiglu" if model.swiglu else "gelu",
                                            "-bf16" if bf16 else "",
                                            "-subparams" if model.qkv_sub_params else "")
        folder = mf.write_deepspeed_pipe(self.p(name, "save"), model, tp, pp, step=STEP,
                                         zero_dp=dp, bf16_optimizer=bf16)
        out = self.p(name, "out", "global_step%d_universal" % STEP)
        self.ok("consolidate", self.p(name, "save"), out, "--no-progress", "--format",
                "deepspeed-universal", "--update-latest")
        return folder, out

    def check(self, model, tp, pp, dp, bf16=False, new_tps=(1, 2, 4)):
        what = "TP%d x PP%d x DP%d %s%s" % (tp, pp, dp, "SwiGLU" if model.swiglu else "GeLU",
                                             " bf16" if bf16 else "")
        folder, out = self.convert(model, tp, pp, dp, bf16)
        info = mf.universal_checkpoint_info(model, tp)
        zero = os.path.join(out, "zero")
        slices = {state: rank_slices(model, tp, pp, WHICH[state]) for state in STATES}
        names = sorted(slices["fp32"])
        self.assertEqual(sorted(n for n in os.listdir(zero) if n != "optimizer_state.pt"), names,
                         what)
        saved = {}
        for name in names:
            self.assertEqual(sorted(os.listdir(os.path.join(zero, name))),
                             ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"], (what, name))
            for state in STATES:
                expected = ds_merge(name, slices[state][name], info)
                have = load(os.path.join(zero, name, state + ".pt"))
                self.assertEqual(sorted(have), sorted(expected), (what, name, state))
                if "sub_param_shape" in expected:  # the object as saved, equal field by field
                    self.assertIsInstance(have["sub_param_shape"], zf.SubparamShape)
                for key, value in expected.items():
                    if key == "param":
                        continue
                    self.assertEqual(have[key], value, (what, name, state, key))
                self.assertEqual(have["param"].dtype, torch.float32)
                self.assertEqual(tuple(have["param"].shape), tuple(expected["param"].shape),
                                 (what, name, state))
                # Bit for bit (torch.equal takes -0.0 for +0.0).
                self.assertTrue(torch.equal(have["param"].view(torch.int32),
                                            expected["param"].view(torch.int32)),
                                "%s %s %s: values differ" % (what, name, state))
                saved[(name, state)] = have
            step = load(os.path.join(zero, name, "step.pt"))
            self.assertTrue(torch.equal(step, torch.tensor(float(STEP))), (what, name, step))
        # The fp32 master weights, not the 16-bit copies of the layer files.
        embed = saved[(mf.ds_module_name(model, "%d.word_embeddings.weight"
                                         % mf.ds_layer_index(model)[0]), "fp32")]["param"]
        self.assertEqual(embed.shape[0], model.vocab)
        self.assertFalse(torch.equal(embed, model.embed[:model.vocab].float()), what)
        # The model-states files, byte for byte; nothing else beside zero/.
        states = sorted(f for f in os.listdir(folder) if re.match(r"mp_rank_\d+_model", f))
        self.assertEqual(len(states), tp * pp)
        for f in states:
            self.assertTrue(filecmp.cmp(os.path.join(folder, f), os.path.join(out, f),
                                        shallow=False), f)
        self.assertEqual(sorted(n for n in os.listdir(out) if n != "reshard-manifest.json"),
                         sorted(states + ["zero"]))
        with open(os.path.join(os.path.dirname(out), "latest_universal")) as f:
            self.assertEqual(f.read().strip(), os.path.basename(out))
        # zero/optimizer_state.pt: mp rank 0, dp rank 0's state without its partitions.
        prefix = "bf16_" if bf16 else ""
        optimizer = load(os.path.join(zero, "optimizer_state.pt"))
        rank0 = load(os.path.join(folder, "%szero_pp_rank_0_mp_rank_00_optim_states.pt"
                                  % prefix))["optimizer_state_dict"]
        for gone in ("base_optimizer_state", "single_partition_of_fp32_groups",
                     "param_slice_mappings"):
            self.assertNotIn(gone, optimizer, what)
        self.assertEqual(optimizer["param_groups"], rank0["base_optimizer_state"]["param_groups"])
        self.assertEqual(optimizer["partition_count"], rank0["partition_count"])
        averaged = {n for n in names
                    if any(re.match(p, n) for p in info.get("parameter_to_average_patterns", []))}
        self.assertEqual(bool(averaged), model.average_norms and tp > 1, what)
        # Loaded back for new TP degrees as DeepSpeed slices it: the fixture's slices of a run
        # with that TP (vocabulary re-padded with zeros).
        for new_tp in new_tps:
            for state in STATES:
                target, logical = repadded(model, getattr(mf.PipeZeroState(model),
                                                          WHICH[state]), new_tp)
                for t in range(new_tp):
                    part = mf.ds_part(logical, t, new_tp)
                    for ds_name, want in part.items():
                        if model.tied and ds_name.startswith("%d." % mf.ds_layer_index(model)[3]):
                            continue
                        name = mf.ds_module_name(model, ds_name)
                        if name in averaged:
                            continue  # a mean of the drifted slices, checked above
                        got = load_hp_slice(saved[(name, state)], want.shape, t, new_tp)
                        self.assertTrue(torch.equal(got, want.float()),
                                        "%s -> TP%d rank %d: %s %s" % (what, new_tp, t, name,
                                                                      state))

    def test_tp_pp_dp_gelu_and_swiglu(self):
        for tp, pp in ((2, 2), (1, 2), (2, 1), (4, 1)):
            for dp in (1, 3):
                for swiglu in (False, True):
                    with self.subTest(tp=tp, pp=pp, dp=dp, swiglu=swiglu):
                        self.check(mf.GPT(train_tp=tp, swiglu=swiglu, vocab=50), tp, pp, dp)

    def test_gqa_query_key_value_with_sub_param_shapes(self):
        # Heads 4, KV groups 2: query_key_value is SubparamShape(((16, 8, 8), 16), 0); TP 4
        # would split a KV group, so TP 1 and 2 (sliced back for 1, 2 and 4 all the same).
        for tp, pp in ((2, 1), (2, 2), (1, 2)):
            for dp in (1, 3):
                with self.subTest(tp=tp, pp=pp, dp=dp):
                    model = mf.GPT(train_tp=tp, vocab=50, heads=4, groups=2, qkv_sub_params=True)
                    self.check(model, tp, pp, dp)
                    info = mf.universal_checkpoint_info(model, tp)
                    self.assertIn("parameter_with_sub_params", info)

    def test_averaged_layer_norms(self):
        """parameter_to_average_patterns: the TP slices (drifted apart, a -0.0 in each) are
        averaged as ds_to_universal's sum(slices) / len(slices) in float32, bit for bit; TP 3
        divides by a number that is not a power of two."""
        for tp, pp, dp, kw, new_tps in ((2, 2, 3, {}, (1, 2, 4)), (4, 1, 1, {}, (1, 2, 4)),
                                        (3, 1, 2, {"heads": 6, "hidden": 18}, (1, 2, 3))):
            with self.subTest(tp=tp, pp=pp, dp=dp):
                model = mf.GPT(train_tp=tp, vocab=50, average_norms=True, **kw)
                self.check(model, tp, pp, dp, new_tps=new_tps)

    def test_untied_output_layer(self):
        self.check(mf.GPT(train_tp=2, vocab=50, tied=False), 2, 2, 3)

    def test_bf16_optimizer(self):
        self.check(mf.GPT(train_tp=2, swiglu=True, vocab=50), 2, 2, 3, bf16=True)

    def test_without_the_optimizer_the_layer_files_are_read(self):
        model = mf.GPT(train_tp=2, vocab=50)
        mf.write_deepspeed_pipe(self.p("save"), model, 2, 2, step=STEP, zero_dp=2)
        info = self.inspect_json(self.p("save"))
        names = [t["name"] for t in info["tensors"]]
        self.assertIn("1.word_embeddings.weight", names)
        self.assertNotIn("tied_modules.embed.word_embeddings.weight", names)

    def test_refusals(self):
        model = mf.GPT(train_tp=2, vocab=50)
        folder = mf.write_deepspeed_pipe(self.p("save"), model, 2, 2, step=STEP, zero_dp=2)
        # A (pp, tp) rank's optimizer files missing.
        for dp in range(2):
            os.rename(os.path.join(folder, "zero_pp_rank_%d_mp_rank_03_optim_states.pt" % dp),
                      self.p("moved-%d" % dp))
        res = self.ctl("consolidate", self.p("save"), self.p("out"), "--no-progress",
                       "--format", "deepspeed-universal")
        self.assertExit(res, 3)  # DataLoss
        self.assertIn("mp rank 3", res.stderr_text)
        self.assertIn("no optimizer files", res.stderr_text)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
