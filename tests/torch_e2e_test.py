"""End-to-end tests of reshard's torch.save reader against real PyTorch (Debian python3-torch).

Run:  /usr/bin/python3 tests/torch_e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]
Files are written by torch.save; reshardctl inspects, consolidates (to safetensors) and verifies
them; outputs are read back with tests/st_reference.py and compared with torch.equal. Hostile and
corrupt inputs must exit 3 with a message naming the file and the problem, never crash, never
create OUT, and never execute anything.
"""

import collections
import io
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
import st_reference as R  # noqa: E402
from st_torch import TAG_OF, tensor_from_st  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip

RESHARDCTL = None


def flatten(obj, prefix=""):
    """Dotted names -> tensors, as reshard names nested state dicts."""
    out = collections.OrderedDict()
    if isinstance(obj, torch.Tensor):
        out[prefix or "tensor"] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(obj, (list, tuple)) and any(isinstance(x, torch.Tensor) or
                                                isinstance(x, (dict, list, tuple)) for x in obj):
        for i, v in enumerate(obj):
            out.update(flatten(v, "%s.%d" % (prefix, i) if prefix else str(i)))
    return out


def zip_entries(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def write_zip(path, entries, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name), data, compress_type=compression)


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-torch"

    def inspect(self, path):
        return self.inspect_json(path)

    def save(self, obj, name, **kw):
        path = self.p(name)
        torch.save(obj, path, **kw)
        return path

    def assertTensorsEqual(self, expected, actual, what=""):
        """expected: name -> torch tensor; actual: name -> st_reference Tensor."""
        self.assertEqual(sorted(expected), sorted(actual), what)
        for name, want in expected.items():
            got = tensor_from_st(actual[name])
            self.assertEqual(got.dtype, want.dtype, "%s %s" % (what, name))
            self.assertEqual(tuple(got.shape), tuple(want.shape), "%s %s" % (what, name))
            self.assertTrue(torch.equal(got, want.contiguous()),
                            "%s %s: values differ" % (what, name))

    def consolidate_and_compare(self, src, expected, *extra):
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress", *extra)
        got = dict(R.read_folder(out))
        # Tied weights may be written once, the alias recorded in __metadata__ as
        # {"alias": "kept name"} (issue 4, item 5); then the alias must resolve to a written
        # tensor equal to the expected one. Never silently missing.
        metadata = {}
        for name in sorted(os.listdir(out)):
            if name.endswith(".safetensors"):
                metadata.update(R.read_file(os.path.join(out, name), with_metadata=True)[1] or {})
        for name in expected:
            if name not in got:
                self.assertIn(name, metadata, "%s neither written nor recorded as an alias (%s)"
                              % (name, metadata))
                self.assertIn(metadata[name], got, metadata)
                got[name] = got[metadata[name]]
        self.assertTensorsEqual(expected, got, "consolidate %s" % " ".join(extra))
        return out

    def expect_rejected(self, src, problem_words, name_in_msg=None, command="consolidate",
                        code=3):
        """Exit `code` (3: DATA_LOSS), a message naming the file and the problem, OUT not
        created; then inspect and verify agree."""
        out = self.p("out-rejected")
        args = [command, src, out, "--no-progress"] if command == "consolidate" else [command, src]
        res = self.ctl(*args)
        self.assertExit(res, code)
        msg = res.stderr_text + res.stdout_text
        self.assertIn(name_in_msg or os.path.basename(src), msg, self.describe(res))
        low = msg.lower()
        self.assertTrue(any(w.lower() in low for w in problem_words),
                        "none of %s in the message%s" % (problem_words, self.describe(res)))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        res = self.ctl("inspect", src, "--json")
        self.assertExit(res, code)
        doc = json.loads(res.stdout_text)
        self.assertFalse(doc["ok"])
        self.assertEqual(doc["exit_code"], code)
        return msg


class TorchReadTests(Base):

    def test_bounded_memory_on_a_320_mib_checkpoint(self):
        # A 320 MiB torch.save file to safetensors: peak RSS under harness.MAX_CONVERSION_RSS.
        g = torch.Generator().manual_seed(5)
        sd = {"layers.%d.weight" % i: torch.randn(2560, 2048, generator=g) for i in range(16)}
        src = self.save(sd, "big.pt")
        del sd
        total = 16 * 2560 * 2048 * 4
        out = self.p("out-big")
        harness.assert_bounded_rss(self, [harness.BINARIES["reshardctl"], "consolidate", src,
                                          out, "--no-progress"], total)
        self.assertEqual(self.inspect_json(out)["total_bytes"], total)

    def nested_checkpoint(self):
        sd = gpt2_like(seed=3)
        model = torch.nn.Linear(4, 3)
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(torch.randn(2, 4)).sum().backward()
        adam.step()
        ckpt = {"model": sd, "optimizer": adam.state_dict(), "step": 1234,
                "cfg": {"lr": 1e-3, "name": "gpt2-tiny", "layers": [2, 16], "dropout": None}}
        return ckpt

    def test_inspect_nested_names_dtypes_shapes_and_other_entries(self):
        ckpt = self.nested_checkpoint()
        src = self.save(ckpt, "ckpt.pt")
        doc = self.inspect(src)
        self.assertEqual(doc["format"], "torch")
        self.assertEqual(doc["layout"], "single-file")
        expected = flatten(ckpt)
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(sorted(got), sorted(expected))
        for name, t in expected.items():
            self.assertEqual(got[name]["dtype"], TAG_OF[t.dtype], name)
            self.assertEqual(got[name]["shape"], list(t.shape), name)
            self.assertEqual(got[name]["bytes"], t.numel() * t.element_size(), name)
        self.assertIn("model.lm_head.weight", got)
        self.assertIn("optimizer.state.0.exp_avg", got)
        other = doc.get("other_entries", [])
        joined = "\n".join(other)
        for key in ("step", "cfg.lr", "cfg.name", "optimizer.param_groups"):
            self.assertIn(key, joined, other)
        for name in expected:
            self.assertNotIn(name + ":", joined, "tensor listed as other entry")

    def test_consolidate_nested_with_tied_embedding(self):
        ckpt = self.nested_checkpoint()
        src = self.save(ckpt, "ckpt.pt")
        out = self.consolidate_and_compare(src, flatten(ckpt))
        self.assertExit(self.ctl("verify", src, out), 0)

    def test_all_dtypes_views_scalar_empty(self):
        g = torch.Generator().manual_seed(5)
        base = torch.randn(6, 8, generator=g)
        sd = collections.OrderedDict()
        for dt in [torch.bfloat16, torch.float16, torch.float32, torch.float64]:
            sd["f.%s" % str(dt)[6:]] = (base * 100).to(dt)
        for dt in [torch.int64, torch.int32, torch.int8, torch.uint8]:
            sd["i.%s" % str(dt)[6:]] = torch.randint(-100 if dt != torch.uint8 else 0, 100,
                                                    (5, 3), generator=g).to(dt)
        sd["b.bool"] = torch.rand(7, generator=g) > 0.5
        # Views of one storage: transposed, sliced with a storage offset, column slice
        # (non-contiguous), a strided step; and the base itself.
        sd["v.base"] = base
        sd["v.t"] = base.t()
        sd["v.rows"] = base[2:5]
        sd["v.cols"] = base[:, 3:6]
        sd["v.step"] = base[::2, 1::3]
        sd["v.row_view"] = base[4]
        half = (base * 10).to(torch.float16)
        sd["v.half_t"] = half.t()[1:]
        sd["s.scalar"] = torch.tensor(3.25)
        sd["s.scalar_int"] = torch.tensor(-7, dtype=torch.int64)
        sd["s.scalar_view"] = base[1, 2]
        sd["e.empty"] = torch.zeros(0)
        sd["e.empty2d"] = torch.zeros(0, 5, dtype=torch.bfloat16)
        sd["e.empty_view"] = base[3:3]
        src = self.save(sd, "views.pt")
        doc = self.inspect(src)
        shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
        self.assertEqual(shapes["s.scalar"], [])
        self.assertEqual(shapes["v.t"], [8, 6])
        self.assertEqual(shapes["e.empty2d"], [0, 5])
        out = self.consolidate_and_compare(src, sd)
        self.assertExit(self.ctl("verify", src, out), 0)

    def test_expanded_stride_zero(self):
        # expand() gives stride 0; torch.save keeps the view (storage of 3 elements).
        base = torch.arange(3, dtype=torch.float32)
        sd = {"x": base.expand(4, 3), "y": torch.tensor([1.0, 2.0]).unsqueeze(1).expand(2, 5)}
        src = self.save(sd, "expand.pt")
        out = self.p("out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        # Either read as the broadcast values, or refused cleanly; never a crash or wrong data.
        self.assertGreaterEqual(res.returncode, 0, self.describe(res))
        if res.returncode == 0:
            self.assertTensorsEqual(sd, R.read_folder(out))
        else:
            self.assertExit(res, 3)
            self.assertFalse(os.path.exists(out))

    def test_consolidate_bf16_matches_torch(self):
        ckpt = self.nested_checkpoint()
        ckpt["model"]["extra.f16"] = torch.randn(3, 5).to(torch.float16)
        ckpt["model"]["extra.f64"] = torch.randn(4, dtype=torch.float64)
        src = self.save(ckpt, "ckpt.pt")
        expected = collections.OrderedDict()
        for name, t in flatten(ckpt).items():
            floating = t.dtype in (torch.float32, torch.float16, torch.bfloat16)
            expected[name] = t.to(torch.bfloat16) if floating else t
        self.consolidate_and_compare(src, expected, "--dtype", "bf16")

    def test_parameters_and_keep_vars(self):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
        sd = model.state_dict(keep_vars=True)  # nn.Parameter -> _rebuild_parameter
        src = self.save(sd, "params.pt")
        self.consolidate_and_compare(src, {k: v.detach() for k, v in sd.items()})

    def test_hf_sharded_folder_with_index(self):
        sd = gpt2_like(seed=9)
        sd.pop("lm_head.weight")  # transformers drops the tied copy from the shards
        names = list(sd)
        groups = [names[:len(names) // 3], names[len(names) // 3:2 * len(names) // 3],
                  names[2 * len(names) // 3:]]
        folder = self.p("hf")
        os.makedirs(folder)
        weight_map = {}
        total = 0
        for i, group in enumerate(groups):
            fname = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(groups))
            torch.save({k: sd[k] for k in group}, os.path.join(folder, fname))
            for k in group:
                weight_map[k] = fname
                total += sd[k].numel() * sd[k].element_size()
        with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        doc = self.inspect(folder)
        self.assertEqual(doc["layout"], "sharded")
        self.consolidate_and_compare(folder, sd)

    def test_hf_pytorch_model_bin_folder_carries_its_model_files(self):
        # save_pretrained with safe_serialization=False: pytorch_model.bin beside config.json,
        # generation_config.json, a tokenizer and a card (as transformers 4 writes config.json:
        # sorted keys, 2-space indent, torch_dtype).
        sd = gpt2_like(seed=3)
        folder = self.p("hf-bin")
        os.makedirs(folder)
        torch.save(sd, os.path.join(folder, "pytorch_model.bin"))
        config = {"architectures": ["GPT2LMHeadModel"], "layer_norm_epsilon": 1e-05,
                  "model_type": "gpt2", "n_embd": 64, "torch_dtype": "float32",
                  "transformers_version": "4.46.0", "vocab_size": 256}
        files = {"config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
                 "generation_config.json": json.dumps({"bos_token_id": 0}, indent=2) + "\n",
                 "vocab.json": json.dumps({"a": 0, "b": 1}), "merges.txt": "#version: 0.2\na b\n",
                 "README.md": "# gpt2-like\n"}
        for name, text in files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        self.assertEqual([os.path.basename(f["path"]) for f in self.inspect(folder)["model_files"]],
                         sorted(files))
        out = self.consolidate_and_compare(
            folder, {k: v.half() if v.dtype in (torch.float32, torch.float16, torch.bfloat16)
                     else v for k, v in sd.items()}, "--dtype", "fp16")
        expected = dict(files)
        expected["config.json"] = json.dumps(dict(config, torch_dtype="float16"), indent=2,
                                             sort_keys=True) + "\n"
        for name, text in expected.items():
            with open(os.path.join(out, name)) as f:
                self.assertEqual(f.read(), text, name)  # config.json: byte for byte as Python's

    def test_folder_of_parts_needs_rules(self):
        g = torch.Generator().manual_seed(11)
        parts = [{"w": torch.randn(4, 6, generator=g), "b": torch.ones(6)} for _ in range(3)]
        folder = self.p("parts")
        os.makedirs(folder)
        for i, part in enumerate(parts):
            torch.save(part, os.path.join(folder, "model_part-%d.pt" % i))
        doc = self.inspect(folder)
        self.assertEqual(doc["layout"], "model-parallel-parts")
        self.assertEqual(doc["parts"], 3)
        out = self.p("out")
        res = self.ctl("consolidate", folder, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("rules", (res.stderr_text + res.stdout_text).lower(), self.describe(res))
        self.assertFalse(os.path.exists(out))
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "^w$", "split_dim": 0},
                                 {"pattern": ".*", "replicate": True}]}, f)
        self.ok("consolidate", folder, out, "--no-progress", "--rules", rules)
        got = R.read_folder(out)
        self.assertTensorsEqual({"w": torch.cat([p["w"] for p in parts], 0), "b": parts[0]["b"]},
                                got)

    def test_verify_torch_against_output(self):
        sd = gpt2_like(seed=13)
        src = self.save(sd, "model.pt")
        out = self.consolidate_and_compare(src, sd)
        res = self.ok("verify", src, out, "--json")
        doc = json.loads(res.stdout_text)
        self.assertTrue(doc["equal"])
        self.assertEqual(doc["tensors_compared"], len(sd))


def torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def replace_pickle(path, pickle_bytes, out_path):
    entries = zip_entries(path)
    entries = [(n, pickle_bytes if n.endswith("/data.pkl") else d) for n, d in entries]
    write_zip(out_path, entries)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def binunicode(s):
    b = s.encode()
    return b"X" + u32(len(b)) + b


class TorchCorruptInputTests(Base):

    def good(self, name="good.pt"):
        g = torch.Generator().manual_seed(21)
        sd = {"a.weight": torch.randn(64, 32, generator=g), "a.bias": torch.randn(32, generator=g),
              "n": torch.arange(10)}
        return self.save(sd, name)

    def test_good_file_baseline(self):
        src = self.good()
        self.assertEqual(len(self.inspect(src)["tensors"]), 3)

    def test_truncated_file_at_several_points(self):
        src = self.good()
        with open(src, "rb") as f:
            data = f.read()
        with zipfile.ZipFile(src) as z:
            offsets = [i.header_offset for i in z.infolist()]
        cuts = sorted(set([10, 100, offsets[1] + 10, offsets[-1] + 5, len(data) // 2,
                           len(data) - 200, len(data) - 60, len(data) - 30, len(data) - 1]))
        for cut in cuts:
            path = self.p("cut-%d.pt" % cut)
            with open(path, "wb") as f:
                f.write(data[:cut])
            self.expect_rejected(path, ["truncated", "end of central directory", "past the end",
                                        "zip"])

    def test_storage_record_shorter_than_pickle_says(self):
        src = self.good()
        entries = zip_entries(src)
        # The 64x32 float storage: drop its last 4 bytes.
        big = max((d for n, d in entries if "/data/" in n), key=len)
        entries = [(n, d[:-4] if d is big else d) for n, d in entries]
        path = self.p("short.pt")
        write_zip(path, entries)
        msg = self.expect_rejected(path, ["should hold", "bytes", "storage"])
        self.assertIn("data/", msg)

    def test_compressed_storage_entry(self):
        src = self.good()
        path = self.p("deflated.pt")
        write_zip(path, zip_entries(src), zipfile.ZIP_DEFLATED)
        self.expect_rejected(path, ["compressed"])

    def test_legacy_format(self):
        # Every pickle protocol torch.save accepts (4 and 5 start with a FRAME).
        for protocol in (2, 4, 5):
            path = self.p("legacy-%d.pt" % protocol)
            torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False,
                       pickle_protocol=protocol)
            self.expect_rejected(path, ["legacy"])

    def test_corrupt_central_directory(self):
        src = self.good()
        with open(src, "rb") as f:
            data = bytearray(f.read())
        cd = data.find(b"PK\x01\x02")
        for name, patch in [("sig", lambda d: d.__setitem__(slice(cd, cd + 4), b"PK\x09\x09")),
                            ("offset", lambda d: d.__setitem__(slice(cd + 42, cd + 46),
                                                               u32(0x7FFFFFF0))),
                            ("namelen", lambda d: d.__setitem__(slice(cd + 28, cd + 30),
                                                                b"\xff\xff"))]:
            d = bytearray(data)
            patch(d)
            path = self.p("cd-%s.pt" % name)
            with open(path, "wb") as f:
                f.write(bytes(d))
            self.expect_rejected(path, ["central directory", "local header", "past the end",
                                        "signature", "zip"])

    # -- hostile data.pkl ----------------------------------------------------------------------

    def hostile(self, name, pkl):
        path = self.p(name + ".pt")
        replace_pickle(self.good(), pkl, path)
        return path

    def test_pickle_deep_nesting(self):
        # Caps of the pickle VM: ResourceExhausted (exit 6).
        path = self.hostile("deep", b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b".")
        self.expect_rejected(path, ["nest", "deep"], code=6)
        path = self.hostile("deep_marks", b"\x80\x02" + b"(" * 100000 + b"t" * 100000 + b".")
        self.expect_rejected(path, ["mark", "nest", "deep"], code=6)

    def test_pickle_bomb_stays_under_the_metadata_cap(self):
        # 16 MiB of EMPTY_LIST: ~230 bytes of values per byte, 3.6 GiB unbounded. reshardctl
        # caps what one pickle builds at 1 GiB (PickleLimits::max_bytes) and refuses it there.
        pkl = b"\x80\x02" + b"]" * (16 << 20) + b"."
        path = self.hostile("bomb", pkl)
        code, out, err, rss = harness.run_peak_rss(
            [harness.BINARIES["reshardctl"], "inspect", path], 120)
        text = (out + err).decode("utf-8", "replace")
        self.assertEqual(code, 6, text[-2000:])
        self.assertIn("bomb.pt: data.pkl: pickle: EMPTY_LIST (0x5d) at byte offset ", text)
        self.assertIn("would exceed the cap of 1 GiB on values built", text)
        self.assertLess(rss, 1280 << 20, "peak RSS %.0f MiB" % (rss / 2**20))
        sys.stderr.write("inspect of a 16 MiB EMPTY_LIST bomb: peak RSS %.0f MiB\n" %
                         (rss / 2**20))

    def test_pickle_deep_nesting_through_memo(self):
        # Each dict is filled after it was stored in its parent: d0["k"] = d1, d1["k"] = d2, ...
        pkl = b"\x80\x02}r" + u32(0)
        for i in range(1, 5000):
            pkl += b"j" + u32(i - 1) + binunicode("k") + b"}r" + u32(i) + b"s0"
        pkl += b"."
        path = self.hostile("deep_memo", pkl)
        # torch.save fills a dict before storing it in its parent; this one is refused.
        self.expect_rejected(path, ["already inside another value"])

    def test_pickle_shared_containers_do_not_explode(self):
        # d_{i+1} = {"a": d_i, "b": d_i}: 60 levels of sharing through the memo, 2^60 paths.
        pkl = b"\x80\x02}r" + u32(0) + b"0"
        for i in range(1, 61):
            pkl += (b"}r" + u32(i) + b"(" + binunicode("a") + b"j" + u32(i - 1) +
                    binunicode("b") + b"j" + u32(i - 1) + b"u0")
        pkl += b"j" + u32(60) + b"."
        path = self.hostile("dag", pkl)
        res = self.ctl("inspect", path, "--json", timeout=20)
        self.assertExit(res, 3)
        self.assertIn("shared so often", res.stderr_text + res.stdout_text, self.describe(res))
        self.assertIn("dag.pt", res.stderr_text + res.stdout_text, self.describe(res))

    def test_pickle_huge_lengths(self):
        for name, pkl in [("unicode8", b"\x80\x04\x8d" + u64(1 << 62) + b"x."),
                          ("bytes8", b"\x80\x04\x8e" + u64((1 << 64) - 1) + b"x."),
                          ("binunicode", b"\x80\x02X" + u32(0xFFFFFFF0) + b"x."),
                          ("long4", b"\x80\x02\x8b" + u32(0x7FFFFFFF) + b"x.")]:
            path = self.hostile("huge-" + name, pkl)
            self.expect_rejected(path, ["needs", "bytes", "length"])

    def test_pickle_memo_abuse(self):
        path = self.hostile("memo-get", b"\x80\x02h\x07.")
        self.expect_rejected(path, ["memo"])
        path = self.hostile("memo-longget", b"\x80\x02j" + u32(0xFFFFFFFF) + b".")
        self.expect_rejected(path, ["memo"])
        # set() of one memoized list, repeated: copies must be bounded. 140 KB of pickle would
        # otherwise build 400M item slots (3.2 GB); 2 GiB of address space must be plenty.
        pkl = (b"\x80\x02c__builtin__\nset\nq\x00" + b"0" + b"]q\x01Nq\x020(" + b"h\x02" * 20000 +
               b"e\x85q\x030(" + b"h\x00h\x03R" * 20000 + b"t.")
        path = self.hostile("memo-amplify", pkl)
        res = self.ctl("inspect", path, "--json", timeout=30, max_memory=2 << 30)
        self.assertExit(res, 3)
        self.assertIn("memo reuse", res.stderr_text + res.stdout_text, self.describe(res))

    def test_pickle_unknown_opcodes(self):
        for name, pkl in [("int", b"\x80\x02I1\n."), ("ext1", b"\x80\x02\x82\x01."),
                          ("ff", b"\x80\x02N\xff."), ("inst", b"\x80\x02(ios\nsystem\n.")]:
            path = self.hostile("op-" + name, pkl)
            msg = self.expect_rejected(path, ["opcode"])
            self.assertIn("data.pkl", msg)
            self.assertIn("byte offset", msg)

    def test_pickle_that_would_run_os_system(self):
        workdir = self.p("work")
        os.makedirs(workdir)
        marker = os.path.join(workdir, "MARKER")
        cmd = "touch %s" % marker
        cases = {
            "reduce": b"\x80\x02cos\nsystem\n" + binunicode(cmd) + b"\x85R.",
            "posix": b"\x80\x02cposix\nsystem\n" + binunicode(cmd) + b"\x85R.",
            "eval": (b"\x80\x02c__builtin__\neval\n" +
                     binunicode("__import__('os').system('%s')" % cmd) + b"\x85R."),
            # The same inside a state dict next to nothing else.
            "in_dict": (b"\x80\x02}(" + binunicode("w") + b"cos\nsystem\n" + binunicode(cmd) +
                        b"\x85Ru."),
        }
        # Sanity: Python itself would run it.
        self.assertEqual(cases["reduce"][-2:], b"R.")
        for name, pkl in cases.items():
            path = self.hostile("exec-" + name, pkl)
            for args in (["inspect", path, "--json"],
                         ["consolidate", path, self.p("out-" + name), "--no-progress"]):
                # The call is never made: it is an entry that is not a tensor, listed by inspect
                # and skipped by consolidate (exit 0, a model without tensors).
                res = self.ctl(*args, cwd=workdir)
                self.assertExit(res, 0)
                self.assertFalse(os.path.exists(marker), "MARKER created" + self.describe(res))
            self.assertEqual(R.read_folder(self.p("out-" + name)), {})
            res = self.ctl("inspect", path, "--json", cwd=workdir)
            self.assertExit(res, 0)
            doc = json.loads(res.stdout_text)
            self.assertEqual(doc["tensors"], [])
            self.assertTrue(any(".system" in e or ".eval" in e
                                for e in doc.get("other_entries", [])), doc)
        self.assertFalse(os.path.exists(marker))

    def test_pickle_storage_key_missing_and_bad_view(self):
        # A tensor whose storage record does not exist, and one viewing past its storage.
        def tensor(key):
            return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" +
                    b"(" + binunicode("storage") + b"ctorch\nFloatStorage\n" + binunicode(key) +
                    binunicode("cpu") + b"K\x04tQ" + b"K\x00" + b"K\x04\x85K\x01\x85" +
                    b"\x89ccollections\nOrderedDict\n)RtR.")
        path = self.hostile("missing-storage", tensor("99"))
        self.expect_rejected(path, ["missing", "data/99"])
        # Storage key 0 of good.pt holds more than 4 floats -> size mismatch.
        path = self.hostile("numel-mismatch", tensor("0"))
        self.expect_rejected(path, ["should hold", "elements"])


def storage_entry_of(path, size):
    """The name of the one storage record of `size` bytes in torch.save file `path`."""
    with zipfile.ZipFile(path) as z:
        names = [i.filename for i in z.infolist() if "/data/" in i.filename and
                 i.file_size == size]
    assert len(names) == 1, names
    return names[0]


class TorchCrcTests(Base):
    """One flipped byte in a stored tensor record: Python's zipfile reports a bad CRC-32, so
    reshard must fail with DATA_LOSS (exit 3) naming the file, the zip entry and the tensor,
    publish nothing, and convert the unmodified file bit-exact."""

    def state_dict(self):
        g = torch.Generator().manual_seed(5)
        whole = torch.randn(256, generator=g)
        return {"a.weight": torch.randn(64, 32, generator=g),
                "a.bias": torch.randn(32, generator=g),
                # views the middle of a 256-float storage: the tensor covers part of its record
                "part": whole[100:116],
                "n": torch.arange(10)}

    def expect_crc_failure(self, src, entry, tensor, *extra):
        out = self.p("out-crc")
        res = self.ctl("consolidate", src, out, "--no-progress", *extra)
        self.assertExit(res, 3)
        for word in (os.path.basename(src), 'zip entry "%s"' % entry, 'tensor "%s"' % tensor,
                     "CRC-32"):
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        return res

    def test_flipped_byte_in_a_tensor_record_is_data_loss(self):
        sd = self.state_dict()
        src = self.save(sd, "good.pt")
        self.consolidate_and_compare(src, {k: v.contiguous() for k, v in sd.items()})
        entry = storage_entry_of(src, 64 * 32 * 4)
        offset, size = harness.stored_entry(src, entry)
        self.assertEqual(size, 64 * 32 * 4)
        for k, at in enumerate((offset, offset + size // 2 + 1, offset + size - 1)):
            bad = harness.flip_byte(src, at, self.p("bad-%d.pt" % k))
            with zipfile.ZipFile(bad) as z:  # Python sees it too
                self.assertEqual(z.testzip(), entry)
            self.expect_crc_failure(bad, entry, "a.weight")
            # Also when the data is converted on the way (read through the mapping).
            self.expect_crc_failure(bad, entry, "a.weight", "--dtype", "bf16")
        # The opt-out converts it, flipped byte and all.
        out = self.p("out-unchecked")
        self.ok("consolidate", bad, out, "--no-progress", "--no-crc-check")
        self.assertTrue(os.path.exists(out))

    def test_flipped_byte_outside_the_view_of_a_partial_tensor(self):
        sd = self.state_dict()
        src = self.save(sd, "good.pt")
        entry = storage_entry_of(src, 256 * 4)
        offset, size = harness.stored_entry(src, entry)
        self.assertEqual(size, 256 * 4)
        # Byte 10 of the record: before the 100th float, which "part" starts at.
        bad = harness.flip_byte(src, offset + 10, self.p("bad.pt"))
        self.expect_crc_failure(bad, entry, "part")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
