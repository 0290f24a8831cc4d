"""End-to-end tests of reshard's OLMo safetensors reader and writer against real torch.

Run:  /usr/bin/python3 tests/olmo_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]

OLMo (olmo/safetensors_util.py) stores nested state dicts in safetensors files whose entry
names are base64.urlsafe_b64encode(pickle.dumps((key_tuple, value_is_pickled))); non-tensor
values are pickled into uint8 tensors. This file implements OLMo's state_dict_to_safetensors_file
and safetensors_file_to_state_dict exactly as OLMo writes them (flatten_dict / unflatten_dict,
encode_key / decode_key); safetensors.torch's save_file and load_file, which Debian does not
package, are replaced by the independent reader and writer of tests/st_reference.py. reshard's
outputs are compared element by element (torch.equal, bit for bit) and value by value with the
state dicts the test made. Corrupt inputs must exit 3 naming the file, the entry and the byte
offset, and never create OUT.
"""

import base64
import collections
import dataclasses
import json
import os
import pickle
import struct
import sys
from typing import Any, Dict, Tuple

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import st_reference as R  # noqa: E402
import st_torch  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip

RESHARDCTL = None


# ------------------------------------------------------------------ olmo/safetensors_util.py

@dataclasses.dataclass(eq=True, frozen=True)
class STKey:
    keys: Tuple
    value_is_pickled: bool


def encode_key(key: STKey) -> str:
    b = pickle.dumps((key.keys, key.value_is_pickled))
    b = base64.urlsafe_b64encode(b)
    return str(b, "ASCII")


def decode_key(key: str) -> STKey:
    b = base64.urlsafe_b64decode(key)
    keys, value_is_pickled = pickle.loads(b)
    return STKey(keys, value_is_pickled)


def flatten_dict(d: Dict) -> Dict[STKey, torch.Tensor]:
    result = {}
    for key, value in d.items():
        if isinstance(value, torch.Tensor):
            result[STKey((key,), False)] = value
        elif isinstance(value, dict):
            value = flatten_dict(value)
            for inner_key, inner_value in value.items():
                result[STKey((key,) + inner_key.keys, inner_key.value_is_pickled)] = inner_value
        else:
            pickled = bytearray(pickle.dumps(value))
            pickled_tensor = torch.frombuffer(pickled, dtype=torch.uint8)
            result[STKey((key,), True)] = pickled_tensor
    return result


def unflatten_dict(d: Dict[STKey, torch.Tensor]) -> Dict:
    result: Dict = {}
    for key, value in d.items():
        if key.value_is_pickled:
            value = pickle.loads(value.numpy().data)
        target_dict = result
        for k in key.keys[:-1]:
            new_target_dict = target_dict.get(k)
            if new_target_dict is None:
                new_target_dict = {}
                target_dict[k] = new_target_dict
            target_dict = new_target_dict
        target_dict[key.keys[-1]] = value
    return result


def save_file(tensors: Dict[str, torch.Tensor], filename):
    """safetensors.torch.save_file (no metadata), through tests/st_reference.py."""
    st_torch.write_file(filename, tensors, metadata={})


def load_file(filename, device="cpu"):
    """safetensors.torch.load_file, through tests/st_reference.py."""
    return dict(st_torch.read_file(filename))


def state_dict_to_safetensors_file(state_dict: Dict, filename):
    state_dict = flatten_dict(state_dict)
    state_dict = {encode_key(k): v for k, v in state_dict.items()}
    save_file(state_dict, filename)


def safetensors_file_to_state_dict(filename, map_location=None) -> Dict[str, Any]:
    if map_location is None:
        map_location = "cpu"
    state_dict = load_file(filename, device=map_location)
    state_dict = {decode_key(k): v for k, v in state_dict.items()}
    return unflatten_dict(state_dict)


# ------------------------------------------------------------------ fixtures and comparisons

def olmo_model(seed):
    """An OLMo-like model state dict: flat dotted names (OLMo stores them as 1-tuples), several
    dtypes, a 0-d tensor."""
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    sd["transformer.wte.weight"] = torch.randn(50, 16, generator=g)
    for i in range(2):
        p = "transformer.blocks.%d." % i
        sd[p + "att_proj.weight"] = torch.randn(48, 16, generator=g)
        sd[p + "attn_out.weight"] = torch.randn(16, 16, generator=g)
        sd[p + "ff_proj.weight"] = (torch.randn(64, 16, generator=g) * 10).to(torch.bfloat16)
        sd[p + "ff_out.weight"] = torch.randn(16, 32, generator=g).to(torch.float16)
    sd["transformer.ln_f.weight"] = torch.ones(16) + 0.01 * torch.randn(16, generator=g)
    sd["transformer.positions"] = torch.arange(-8, 8, dtype=torch.int64)
    sd["transformer.mask"] = torch.rand(3, 5, generator=g) > 0.5
    sd["transformer.scale"] = torch.tensor(0.125)
    return sd


def olmo_optim(model, seed):
    """An AdamW state dict as torch makes it: int-keyed `state`, `param_groups` with floats,
    tuples, lists and None."""
    g = torch.Generator().manual_seed(seed)
    names = [n for n, t in model.items() if t.is_floating_point() and t.dim() == 2]
    state = {}
    for i, n in enumerate(names):
        shape = model[n].shape
        state[i] = {"step": torch.tensor(float(10 + i)),
                    "exp_avg": torch.randn(*shape, generator=g),
                    "exp_avg_sq": torch.rand(*shape, generator=g)}
    groups = [{"lr": 4e-4, "betas": (0.9, 0.95), "eps": 1e-5, "weight_decay": 0.1,
               "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
               "initial_lr": 4e-4, "params": list(range(len(names))), "param_names": names}]
    return {"state": state, "param_groups": groups}


def assert_same(test, expected, actual, path="root"):
    """Nested dicts, lists and tuples equal; tensors equal bit for bit with dtype and shape."""
    if isinstance(expected, torch.Tensor):
        test.assertIsInstance(actual, torch.Tensor, path)
        test.assertEqual(actual.dtype, expected.dtype, path)
        test.assertEqual(tuple(actual.shape), tuple(expected.shape), path)
        a, e = actual.contiguous(), expected.contiguous()
        if e.is_floating_point():
            bits = {torch.float32: torch.int32, torch.float16: torch.int16,
                    torch.bfloat16: torch.int16, torch.float64: torch.int64}[e.dtype]
            a, e = a.view(bits), e.view(bits)
        test.assertTrue(torch.equal(a, e), path)
    elif isinstance(expected, dict):
        test.assertIsInstance(actual, dict, path)
        test.assertEqual(set(actual.keys()), set(expected.keys()), path)
        for k in expected:
            assert_same(test, expected[k], actual[k], "%s.%s" % (path, k))
    elif isinstance(expected, (list, tuple)):
        test.assertIs(type(actual), type(expected), path)
        test.assertEqual(len(actual), len(expected), path)
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(test, e, a, "%s[%d]" % (path, i))
    else:
        test.assertIs(type(actual), type(expected), path)
        test.assertEqual(actual, expected, path)


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-olmo"

    def convert(self, *args):
        res = self.ctl(*args, "--no-progress")
        self.assertExit(res, 0)
        return res

    def refused(self, command, src, *flags):
        """`command src OUT flags` exits 3 without creating OUT; returns the message."""
        out = self.p("refused-out")
        res = self.ctl(command, src, out, *flags, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        # Words are looked for with the temporary folder's name (the test's name) left out.
        return res.text.replace(self.tmp, "<tmp>")


# ------------------------------------------------------------------ reading OLMo files

class OlmoReadTests(Base):

    def write_olmo(self, sd, name="model.safetensors"):
        path = self.p(name)
        state_dict_to_safetensors_file(sd, path)
        return path

    def test_keys_are_olmos(self):
        # The keys the test writes are the ones the reference documents.
        self.assertEqual(encode_key(STKey(("optim", "state", 0, "exp_avg"), False)),
                         "gASVIwAAAAAAAAAojAVvcHRpbZSMBXN0YXRllEsAjAdleHBfYXZnlHSUiYaULg==")

    def test_inspect_names_the_layout_and_the_values(self):
        model = olmo_model(1)
        path = self.write_olmo({"model": model, "optim": olmo_optim(model, 2), "step": 17})
        doc = self.inspect_json(path)
        self.assertEqual(doc["format"], "olmo-safetensors")
        text = json.dumps(doc)
        self.assertIn("OLMo safetensors", text)
        self.assertIn("pickled value", text)
        names = {t["name"] for t in doc["tensors"]}
        self.assertIn("model.transformer.wte.weight", names)
        self.assertIn("optim.state.0.exp_avg_sq", names)
        self.assertIn("optim.param_groups", text)

    def test_model_and_optimizer_to_torch_rebuild_the_nested_dict(self):
        model = olmo_model(3)
        sd = {"model": model, "optim": olmo_optim(model, 4), "step": 17, "note": "olmo"}
        path = self.write_olmo(sd)
        out = self.p("out")
        self.convert("consolidate", path, out, "--format", "torch")
        loaded = torch.load(os.path.join(out, "pytorch_model.bin"))
        assert_same(self, sd, loaded)
        # OLMo's own loader agrees with what reshard read.
        assert_same(self, safetensors_file_to_state_dict(path), loaded)

    def test_to_plain_safetensors_gives_dotted_names(self):
        model = olmo_model(5)
        path = self.write_olmo({"model": model, "optim": olmo_optim(model, 6)})
        out = self.p("out")
        self.convert("consolidate", path, out)
        got = st_torch.read_folder(out)
        expected = {"model." + k: v for k, v in model.items()}
        for i, st in olmo_optim(model, 6)["state"].items():
            for k, v in st.items():
                expected["optim.state.%d.%s" % (i, k)] = v
        self.assertEqual(set(got), set(expected))
        for k in expected:
            assert_same(self, expected[k], got[k], k)

    def test_unsharded_folder_model_and_optim(self):
        # OLMo's unshard --safe-tensors writes model.safetensors and optim.safetensors.
        model = olmo_model(7)
        optim = olmo_optim(model, 8)
        self.write_olmo(model, "model.safetensors")
        self.write_olmo(optim, "optim.safetensors")
        out = self.p("out")
        self.convert("consolidate", self.tmp, out, "--format", "torch")
        loaded = torch.load(os.path.join(out, "pytorch_model.bin"))
        merged = dict(model)
        merged.update(optim)
        assert_same(self, merged, loaded)

    def test_bf16_conversion(self):
        model = olmo_model(9)
        path = self.write_olmo(model)
        out = self.p("out")
        self.convert("consolidate", path, out, "--dtype", "bf16", "--format", "olmo-safetensors")
        got = safetensors_file_to_state_dict(os.path.join(out, "model.safetensors"))
        self.assertEqual(set(got), set(model))
        for k, v in model.items():
            want = v.to(torch.bfloat16) if v.is_floating_point() else v
            assert_same(self, want, got[k], k)


# ------------------------------------------------------------------ writing OLMo files

class OlmoWriteTests(Base):

    def test_pt_to_olmo_and_back(self):
        model = olmo_model(11)
        sd = {"model": model, "optim": olmo_optim(model, 12), "step": 5,
              "cfg": {"d_model": 16, "name": "olmo-tiny", "layers": [2, 16], "dropout": None},
              "empty": {}}
        src = self.p("ckpt.pt")
        torch.save(sd, src)
        out = self.p("olmo")
        self.convert("consolidate", src, out, "--format", "olmo-safetensors")
        self.assertEqual(sorted(os.listdir(out)), ["model.safetensors", "reshard-manifest.json"])
        path = os.path.join(out, "model.safetensors")
        # OLMo's loader rebuilds the nested dict, optimizer state included.
        assert_same(self, sd, safetensors_file_to_state_dict(path))
        # Every name is OLMo's encoding; no __metadata__, as OLMo writes none.
        _, header = st_header(path)
        self.assertNotIn("__metadata__", header)
        for name in header:
            self.assertTrue(name.startswith("gASV"), name)
            decode_key(name)
        # And back to .pt.
        back = self.p("back")
        self.convert("consolidate", out, back, "--format", "torch")
        assert_same(self, sd, torch.load(os.path.join(back, "pytorch_model.bin")))

    def test_same_keys_as_olmo_writes(self):
        model = olmo_model(13)
        sd = {"model": model, "optim": olmo_optim(model, 14)}
        theirs = self.p("theirs.safetensors")
        state_dict_to_safetensors_file(sd, theirs)
        out = self.p("ours")
        self.convert("consolidate", theirs, out, "--format", "olmo-safetensors")
        ours = os.path.join(out, "model.safetensors")
        _, h_theirs = st_header(theirs)
        _, h_ours = st_header(ours)
        self.assertEqual(set(h_theirs), set(h_ours))
        assert_same(self, safetensors_file_to_state_dict(theirs),
                    safetensors_file_to_state_dict(ours))

    def test_flat_safetensors_input_becomes_one_tuple_keys(self):
        model = olmo_model(15)
        src = self.p("hf.safetensors")
        save_file(dict(model), src)
        out = self.p("olmo")
        self.convert("consolidate", src, out, "--format", "olmo-safetensors")
        path = os.path.join(out, "model.safetensors")
        _, header = st_header(path)
        self.assertEqual({decode_key(k).keys for k in header}, {(k,) for k in model})
        assert_same(self, dict(model), safetensors_file_to_state_dict(path))

    def test_tied_weights_are_written_under_every_name(self):
        model = olmo_model(17)
        model["lm_head.weight"] = model["transformer.wte.weight"]  # one storage
        src = self.p("tied.pt")
        torch.save(model, src)
        out = self.p("olmo")
        self.convert("consolidate", src, out, "--format", "olmo-safetensors")
        got = safetensors_file_to_state_dict(os.path.join(out, "model.safetensors"))
        assert_same(self, dict(model), got)

    def test_reshard_parts_are_olmo_files(self):
        model = olmo_model(19)
        src = self.p("m.pt")
        torch.save(model, src)
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "att_proj", "split_dim": 0},
                                 {"pattern": ".*", "replicate": True}]}, f)
        out = self.p("parts")
        self.convert("reshard", src, out, "--parts", "2", "--rules", rules,
                "--format", "olmo-safetensors")
        parts = [safetensors_file_to_state_dict(os.path.join(out, "model_part-%d.safetensors" % i))
                 for i in range(2)]
        for name, t in model.items():
            if "att_proj" in name:
                assert_same(self, t, torch.cat([parts[0][name], parts[1][name]]), name)
            else:
                assert_same(self, t, parts[0][name], name)
                assert_same(self, t, parts[1][name], name)

    def test_bounded_memory_both_ways(self):
        g = torch.Generator().manual_seed(21)
        sd = {"model": {"layers.%d.weight" % i: torch.randn(2560, 2048, generator=g)
                        for i in range(16)},
              "optim": {"param_groups": [{"lr": 1e-3, "params": list(range(16))}]}}
        src = self.p("big.pt")
        torch.save(sd, src)
        expected = {k: v[:3].clone() for k, v in sd["model"].items()}
        del sd
        total = 16 * 2560 * 2048 * 4
        olmo = self.p("olmo")
        harness.assert_bounded_rss(self, [RESHARDCTL, "consolidate", src, olmo,
                                          "--format", "olmo-safetensors", "--no-progress"], total)
        os.remove(src)
        got = safetensors_file_to_state_dict(os.path.join(olmo, "model.safetensors"))
        self.assertEqual(got["optim"], {"param_groups": [{"lr": 1e-3, "params": list(range(16))}]})
        for k, v in expected.items():
            assert_same(self, v, got["model"][k][:3], k)
        del got
        back = self.p("back")
        harness.assert_bounded_rss(self, [RESHARDCTL, "consolidate", olmo, back,
                                          "--format", "torch", "--no-progress"], total)
        loaded = torch.load(os.path.join(back, "pytorch_model.bin"))
        for k, v in expected.items():
            assert_same(self, v, loaded["model"][k][:3], k)

    def test_tensor_inside_a_list_is_refused(self):
        # OLMo pickles lists whole; a tensor inside one has no place in a safetensors file.
        src = self.p("list.pt")
        torch.save({"w": torch.ones(2), "buffers": [torch.zeros(3)]}, src)
        msg = self.refused("consolidate", src, "--format", "olmo-safetensors")
        self.assertIn("('buffers',)", msg)
        self.assertIn("tensor", msg)


# ------------------------------------------------------------------ refusals

class OlmoRefusalTests(Base):

    def olmo_file(self):
        model = olmo_model(31)
        path = self.p("model.safetensors")
        state_dict_to_safetensors_file({"model": model, "optim": olmo_optim(model, 32)}, path)
        return path

    def replace_name(self, path, old, new):
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = data[8:8 + n]
        self.assertEqual(len(old), len(new))
        self.assertIn(old.encode(), header)
        with open(path, "wb") as f:
            f.write(data[:8] + header.replace(old.encode(), new.encode(), 1) + data[8 + n:])

    def test_bad_base64_key(self):
        path = self.olmo_file()
        _, header = st_header(path)
        victim = next(iter(header))  # the first name: detection must still pick OLMo's reader
        bad = victim[:10] + "*" + victim[11:]
        self.replace_name(path, victim, bad)
        msg = self.refused("consolidate", path)
        self.assertIn(path.replace(self.tmp, "<tmp>"), msg)
        self.assertIn(bad[:40], msg)
        self.assertIn("byte offset", msg)
        self.assertIn("base64", msg)

    def test_key_that_is_not_olmos_tuple(self):
        path = self.olmo_file()
        _, header = st_header(path)
        victim = sorted(header)[0]
        # Same length: a pickled list instead of (keys, bool), padded with a string.
        pad = len(base64.urlsafe_b64decode(victim)) - len(pickle.dumps([0, ""]))
        other = base64.urlsafe_b64encode(pickle.dumps([0, "x" * (pad - 1)], protocol=4)).decode()
        while len(other) != len(victim):
            pad += 1 if len(other) < len(victim) else -1
            other = base64.urlsafe_b64encode(pickle.dumps([0, "x" * pad], protocol=4)).decode()
        self.replace_name(path, victim, other)
        msg = self.refused("consolidate", path)
        self.assertIn(path.replace(self.tmp, "<tmp>"), msg)
        self.assertIn("not OLMo's", msg)

    def test_corrupt_pickled_value(self):
        path = self.olmo_file()
        n, header = st_header(path)
        name = next(k for k in header if decode_key(k).value_is_pickled)
        begin, end = header[name]["data_offsets"]
        with open(path, "r+b") as f:
            f.seek(8 + n + begin)
            f.write(b"\x81")  # PROTO -> NEWOBJ on an empty stack
        msg = self.refused("consolidate", path, "--format", "torch")
        self.assertIn(path.replace(self.tmp, "<tmp>"), msg)
        self.assertIn("byte offset %d" % (8 + n + begin), msg)
        self.assertIn("param_groups", msg)

    def test_truncated_file(self):
        path = self.olmo_file()
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 3)
        msg = self.refused("consolidate", path)
        self.assertIn(path.replace(self.tmp, "<tmp>"), msg)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
