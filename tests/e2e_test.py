"""End-to-end / interoperability tests for `reshardctl` (local mode).

Run:  /usr/bin/python3 tests/e2e_test.py --reshardctl PATH [unittest args, e.g. ClassName]
The contract tested is docs/cli.md ("reshardctl").  Expected values come from tests/st_reference.py,
an independent numpy implementation of the safetensors format and of the conversions.
"""

import collections
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import unittest

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import st_reference as R  # noqa: E402

RESHARDCTL = None
DEFAULT_TIMEOUT = 180
STAGING_SUFFIX = ".reshard-staging"
MANIFEST = "reshard-manifest.json"


def staging_path(out):
    out = os.path.abspath(out).rstrip("/")
    return os.path.join(os.path.dirname(out), "." + os.path.basename(out) + STAGING_SUFFIX)


_XXH = None


def xxh3_64_file(path):
    """XXH3-64 (seed 0) of a whole file via the system libxxhash (upstream xxHash, not reshard)."""
    global _XXH
    import ctypes
    if _XXH is None:
        lib = ctypes.CDLL("libxxhash.so.0")
        lib.XXH3_64bits.restype = ctypes.c_uint64
        lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _XXH = lib
    data = read_bytes(path)
    return "%016x" % _XXH.XXH3_64bits(data, len(data))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def tail(s, n=3000):
    return s if len(s) <= n else "..." + s[-n:]


class Base(harness.TempDirTestCase):
    TMP_PREFIX = "reshard-e2e"

    def ctl(self, *args, timeout=DEFAULT_TIMEOUT):
        cmd = [RESHARDCTL] + [str(a) for a in args]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        res.stdout_text = res.stdout.decode("utf-8", "replace")
        res.stderr_text = res.stderr.decode("utf-8", "replace")
        res.cmd = cmd
        return res

    def describe(self, res):
        return "\ncommand: %s\nexit: %s\nstdout: %s\nstderr: %s" % (
            " ".join(res.cmd), res.returncode, tail(res.stdout_text), tail(res.stderr_text))

    def assertExit(self, res, code):
        self.assertGreaterEqual(res.returncode, 0, "killed by a signal (crash)" + self.describe(res))
        self.assertEqual(res.returncode, code, "unexpected exit code" + self.describe(res))

    def ok(self, *args, **kw):
        res = self.ctl(*args, **kw)
        self.assertExit(res, 0)
        return res

    def json_of(self, res):
        try:
            doc = json.loads(res.stdout_text)
        except ValueError as e:
            self.fail("stdout is not exactly one JSON document (%s)%s" % (e, self.describe(res)))
        self.assertIsInstance(doc, dict, self.describe(res))
        return doc

    def write_rules(self, rules, name="rules.json"):
        path = self.p(name)
        with open(path, "w") as f:
            json.dump(rules, f)
        return path

    def write_model(self, sd, name="model.safetensors", metadata=None):
        path = self.p(name)
        R.write_file(path, sd, metadata)
        return path

    def data_offset(self, path, name):
        """The offset in the safetensors file `path` of tensor `name`'s first byte."""
        _, entries, _, start = R.parse_header(path)
        return start + next(begin for n, _, _, begin, _ in entries if n == name)

    def write_parts(self, parts, folder="parts", fmt="model_part-%d.safetensors"):
        d = self.p(folder)
        os.makedirs(d)
        for i, part in enumerate(parts):
            R.write_file(os.path.join(d, fmt % i), part)
        return d

    def assertSameTensors(self, expected, actual, nan_any=False, what=""):
        self.assertEqual(sorted(actual), sorted(expected), "tensor names differ " + what)
        bad = []
        for name in expected:
            d = R.diff_tensors(expected[name], actual[name], nan_any=nan_any)
            if d:
                bad.append("%s: %s" % (name, d))
        self.assertFalse(bad, "tensors differ %s:\n  %s" % (what, "\n  ".join(bad[:20])))

    def check_canonical(self, path, part=None, parts=None):
        """Writer conventions from the contract (reference writer behaviour)."""
        n, entries, metadata, _ = R.parse_header(path)
        with open(path, "rb") as f:
            f.seek(8)
            header = f.read(n)
        self.assertEqual(n % 8, 0, "%s: header length %d not a multiple of 8" % (path, n))
        stripped = header.rstrip(b" ")
        self.assertTrue(stripped.endswith(b"}"), "%s: header padding is not spaces" % path)
        self.assertLess(len(header) - len(stripped), 8, "%s: more than 7 padding bytes" % path)
        expected_md = {"format": "pt"}
        if part is not None:
            expected_md = {"format": "pt", "reshard_part": str(part), "reshard_parts": str(parts)}
        self.assertEqual(metadata, expected_md, "%s: __metadata__" % path)
        by_offset = [e[0] for e in sorted(entries, key=lambda e: (e[3], e[4]))]
        by_rule = [e[0] for e in sorted(entries, key=lambda e: R.sort_key(e[0], e[1]))]
        # Empty tensors share offsets; compare the ordering of non-empty ones strictly and
        # require the whole list to be consistent with dtype-desc-then-name.
        offs = {e[0]: (e[3], e[4]) for e in entries}
        for a, b in zip(by_rule, by_rule[1:]):
            self.assertLessEqual(offs[a][1], offs[b][0],
                                 "%s: tensor order is not dtype desc then name (%s before %s)"
                                 % (path, a, b))
        self.assertEqual(len(by_offset), len(by_rule))

    def check_output_folder(self, out, expected_files=None, parts=None):
        """Staging gone, manifest consistent, every safetensors file canonical."""
        self.assertTrue(os.path.isdir(out), "output folder missing: %s" % out)
        self.assertFalse(os.path.exists(staging_path(out)),
                         "staging folder left after success: %s" % staging_path(out))
        names = sorted(os.listdir(out))
        self.assertIn(MANIFEST, names)
        st_files = [n for n in names if n.endswith(".safetensors")]
        if expected_files is not None:
            self.assertEqual(sorted(names), sorted(list(expected_files) + [MANIFEST]),
                             "output folder content")
        for fn in st_files:
            if parts:
                m = re.match(r"model_part-(\d+)\.safetensors$", fn)
                self.assertTrue(m, fn)
                self.check_canonical(os.path.join(out, fn), int(m.group(1)), parts)
            else:
                self.check_canonical(os.path.join(out, fn))
        with open(os.path.join(out, MANIFEST)) as f:
            man = json.load(f)
        self.assertEqual(man.get("tool"), "reshard")
        self.assertIn("version", man)
        self.assertIn("source", man)
        listed = {e["name"]: e for e in man["files"]}
        for fn in st_files:
            self.assertIn(fn, listed, "manifest files lacks %s" % fn)
        for name, e in listed.items():
            fp = os.path.join(out, name)
            self.assertTrue(os.path.isfile(fp), "manifest lists missing file %s" % name)
            self.assertEqual(e["bytes"], os.path.getsize(fp), "manifest bytes of %s" % name)
            self.assertEqual(str(e["xxh3_64"]).lower(), xxh3_64_file(fp),
                             "manifest xxh3_64 of %s (checked with libxxhash)" % name)
        actual = {}
        for fn in st_files:
            for name, t in R.read_file(os.path.join(out, fn)).items():
                actual.setdefault(name, []).append((fn, t))
        mt = man["tensors"]
        if parts:
            # One entry per (tensor, part file) or per tensor; each must match a real tensor.
            for e in mt:
                self.assertIn(e["name"], actual)
        else:
            self.assertEqual(sorted(e["name"] for e in mt), sorted(actual))
            for e in mt:
                (fn, t), = actual[e["name"]]
                self.assertEqual(e["file"], fn, e["name"])
                self.assertEqual(e["dtype"], t.dtype, e["name"])
                self.assertEqual(list(e["shape"]), list(t.shape), e["name"])
        return man

    def check_index(self, out):
        index = R.read_index(out)
        wm = index["weight_map"]
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        n = len(files)
        self.assertEqual(files, [R.hf_shard_name(i, n) for i in range(1, n + 1)])
        total = 0
        for fn in files:
            for name, t in R.read_file(os.path.join(out, fn)).items():
                self.assertEqual(wm.get(name), fn, "weight_map[%s]" % name)
                total += t.nbytes
        self.assertEqual(len(wm), sum(len(R.read_file(os.path.join(out, f))) for f in files))
        self.assertEqual(index["metadata"]["total_size"], total, "total_size")
        return index


# ==============================================================================================


class ConsolidateTests(Base):

    def test_bounded_memory_on_a_320_mib_model(self):
        # Four 80 MiB F32 shards to BF16 (read through the mapping) and to F32 (plain copies):
        # the peak RSS stays under harness.MAX_CONVERSION_RSS, far below the model's size.
        rng = np.random.default_rng(7)
        src = self.p("big")
        os.makedirs(src)
        total = 0
        for i in range(4):
            sd = {"layers.%d.w%d" % (i, j): R.Tensor("F32", rng.standard_normal(
                (2560, 2048), dtype=np.float32)) for j in range(4)}
            R.write_file(os.path.join(src, "model-%d-of-4.safetensors" % i), sd)
            total += sum(t.nbytes for t in sd.values())
        for dtype in ("bf16", "f32"):
            out = self.p("out-" + dtype)
            harness.assert_bounded_rss(self, [RESHARDCTL, "consolidate", src, out, "--dtype",
                                              dtype, "--no-progress"], total)
            doc = self.json_of(self.ctl("inspect", out, "--json"))
            self.assertEqual(doc["tensor_count"], 16)
            self.assertEqual(doc["total_bytes"], total // 2 if dtype == "bf16" else total)

    def test_libcurl_is_not_linked(self):
        # libcurl and the ~30 libraries it needs cost 4-5 MiB of resident memory at every start;
        # lib/io/s3:curl_library loads it only for s3:// paths. A -lcurl creeping back in shows
        # here, not only as a drift in the benchmarks' peak RSS.
        res = subprocess.run(["readelf", "-d", RESHARDCTL], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("(NEEDED)", res.stdout)
        self.assertNotIn("libcurl", res.stdout)

    def test_sharded_folder_to_single_file(self):
        sd = R.llama_like(seed=11)
        names = list(sd)
        groups = [names[0::3], names[1::3], names[2::3]]
        src = self.p("in")
        R.write_sharded(src, sd, groups)
        out = self.p("out")
        res = self.ok("consolidate", src, out, "--no-progress", "--json")
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), True)
        for k in ("output", "files", "tensors", "bytes_read", "bytes_written", "seconds"):
            self.assertIn(k, doc, "consolidate --json lacks %s" % k)
        self.check_output_folder(out, ["model.safetensors"])
        got = R.read_folder(out)
        self.assertSameTensors(sd, got, nan_any=False)
        self.assertEqual(len(doc["files"]), 1)
        f0 = doc["files"][0]
        self.assertEqual(os.path.basename(f0["name"]), "model.safetensors")
        self.assertEqual(f0["bytes"], os.path.getsize(os.path.join(out, "model.safetensors")))
        tensors_field = doc["tensors"]
        n = tensors_field if isinstance(tensors_field, int) else len(tensors_field)
        self.assertEqual(n, len(sd))
        f0t = f0["tensors"]
        self.assertEqual(f0t if isinstance(f0t, int) else len(f0t), len(sd))
        data = sum(t.nbytes for t in sd.values())
        self.assertGreaterEqual(doc["bytes_written"], data)
        self.assertGreaterEqual(doc["bytes_read"], data)
        man = json.loads(read_bytes(os.path.join(out, MANIFEST)))
        self.assertEqual([e["xxh3_64"] for e in man["files"] if e["name"] == "model.safetensors"],
                         [f0["xxh3_64"]], "manifest and --json disagree on xxh3_64")

    def test_index_with_extra_metadata_keys_and_sorted_layout(self):
        # transformers writes json.dumps(index, indent=2, sort_keys=True); huggingface_hub may
        # add extra keys to "metadata".  Readers must ignore unknown keys.
        sd = R.llama_like(seed=19)
        names = list(sd)
        src = self.p("in")
        R.write_sharded(src, sd, [names[1::2], names[0::2]])
        index = R.read_index(src)
        index["metadata"]["total_parameters"] = 12345
        index["metadata"]["lm_head.weight"] = "model.embed_tokens.weight"
        with open(os.path.join(src, R.INDEX_NAME), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.assertSameTensors(sd, R.read_folder(out))

    def test_json_stdout_clean_with_progress_enabled(self):
        sd = R.llama_like(seed=20)
        src = self.write_model(sd)
        out = self.p("out")
        res = self.ok("consolidate", src, out, "--json", "--max-shard-size", "4KB")
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), True)
        self.check_output_folder(out)

    def test_folder_of_disjoint_files_without_index(self):
        sd = R.gpt_like(seed=3)
        names = list(sd)
        src = self.p("in")
        os.makedirs(src)
        for i, chunk in enumerate([names[:10], names[10:17], names[17:]]):
            R.write_file(os.path.join(src, "piece%d.safetensors" % i), {k: sd[k] for k in chunk})
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.check_output_folder(out, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(out))

    def test_writer_bytes_match_reference_writer(self):
        sd = R.llama_like(seed=12)
        src = self.write_model(sd)
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.check_output_folder(out, ["model.safetensors"])
        with open(src, "rb") as a, open(os.path.join(out, "model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read(),
                             "canonical input must be reproduced byte for byte by the writer")

    def test_max_shard_size_property_and_index(self):
        sd = R.llama_like(seed=13, hidden=32, inter=64, vocab=40)
        src = self.p("in")
        names = list(sd)
        R.write_sharded(src, sd, [names[: len(names) // 2], names[len(names) // 2:]])
        out = self.p("out")
        limit = 2048
        self.ok("consolidate", src, out, "--max-shard-size", "2KiB", "--no-progress")
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        self.assertGreater(len(files), 2)
        self.check_output_folder(out, files + [R.INDEX_NAME])
        self.check_index(out)
        big = {k for k, t in sd.items() if t.nbytes > limit}
        self.assertTrue(big, "test model must contain tensors larger than the limit")
        for fn in files:
            tensors = R.read_file(os.path.join(out, fn))
            size = sum(t.nbytes for t in tensors.values())
            if set(tensors) & big:
                self.assertEqual(len(tensors), 1, "%s: oversized tensor not alone: %s"
                                 % (fn, sorted(tensors)))
            else:
                self.assertLessEqual(size, limit, "%s holds %d data bytes" % (fn, size))
        self.assertSameTensors(sd, R.read_folder(out))

    def test_max_shard_size_exact_hf_assignment(self):
        # Single dtype, single input file: catalog order == name order == file order.
        rng = np.random.default_rng(7)
        sizes = [100, 100, 50, 750, 10, 250, 30, 400, 250, 60, 1000, 10, 500, 500, 1]
        sd = collections.OrderedDict()
        for i, n in enumerate(sizes):
            sd["t%02d" % i] = R.random_tensor(rng, "F32", (n,))
        src = self.write_model(sd)
        out = self.p("out")
        self.ok("consolidate", src, out, "--max-shard-size", "2KB", "--no-progress")
        expected = R.hf_split([(k, sd[k].nbytes) for k in sorted(sd)], 2000)
        n = len(expected)
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        self.assertEqual(files, [R.hf_shard_name(i, n) for i in range(1, n + 1)])
        index = self.check_index(out)
        exp_wm = {k: R.hf_shard_name(i, n) for i, g in enumerate(expected, 1) for k in g}
        self.assertEqual(index["weight_map"], exp_wm,
                         "HF split rule (oversized tensor appended as its own shard at once, "
                         "current shard stays open; new shard when current+size > limit)")
        self.assertSameTensors(sd, R.read_folder(out))

    def test_max_shard_size_units(self):
        rng = np.random.default_rng(8)
        sd = collections.OrderedDict(
            ("w%d" % i, R.random_tensor(rng, "F32", (128,))) for i in range(2))  # 512 B each
        src = self.write_model(sd)
        for spec, nfiles in [("1KB", 2), ("1KiB", 1), ("1000", 2), ("1024", 1), ("1MB", 1)]:
            with self.subTest(spec=spec):
                out = self.p("out-" + spec)
                self.ok("consolidate", src, out, "--max-shard-size", spec, "--no-progress")
                files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
                if nfiles == 1:
                    self.assertEqual(files, ["model.safetensors"])
                    self.assertFalse(os.path.exists(os.path.join(out, R.INDEX_NAME)),
                                     "one output file must not get an index")
                else:
                    self.assertEqual(len(files), nfiles)
                    self.check_index(out)
                self.assertSameTensors(sd, R.read_folder(out))

    def test_threads_and_window_do_not_change_bytes(self):
        rng = np.random.default_rng(10)
        sd = collections.OrderedDict()
        for i, dt in enumerate(["F32", "BF16", "F16", "F32", "I64", "U8"]):
            sd["big.%d" % i] = R.random_tensor(rng, dt, (300, 700 + i))
        sd.update(R.llama_like(seed=14))
        src = self.p("in")
        names = list(sd)
        R.write_sharded(src, sd, [names[0::2], names[1::2]])
        outs = []
        for j, extra in enumerate([[], ["--threads", "1", "--window-size", "64KiB"],
                                   ["--threads", "2", "--window-size", "64KiB"],
                                   ["--threads", "2", "--window-size", "1MiB"]]):
            out = self.p("out%d" % j)
            self.ok("consolidate", src, out, "--dtype", "bf16", "--max-shard-size", "1MB",
                    "--no-progress", *extra)
            files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
            outs.append({f: read_bytes(os.path.join(out, f)) for f in files})
            self.check_output_folder(out)
        for j in range(1, len(outs)):
            self.assertEqual(sorted(outs[j]), sorted(outs[0]))
            for f in outs[0]:
                self.assertTrue(outs[j][f] == outs[0][f],
                                "%s differs between runs with different threads/window" % f)
        expected = collections.OrderedDict((k, R.convert(t, "bf16")) for k, t in sd.items())
        self.assertSameTensors(expected, R.read_folder(self.p("out1")), nan_any=True)

    def test_names_needing_json_escapes_and_many_tensors(self):
        rng = np.random.default_rng(15)
        sd = collections.OrderedDict()
        for name in ['quote"name', "back\\slash", "new\nline", "tab\there", "ctl\x01x",
                     "\u6a21\u578b.\u6743\u91cd", "emoji.\U0001F600", "slash/ok", "sp ace"]:
            sd[name] = R.random_tensor(rng, "F32", (3,))
        for i in range(3000):
            sd["many.%04d" % i] = R.random_tensor(rng, ["F16", "I8", "BF16"][i % 3], (i % 5,))
        src = self.write_model(sd)
        out = self.p("out")
        self.ok("consolidate", src, out, "--no-progress")
        self.check_output_folder(out, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(out))
        out2 = self.p("out2")
        self.ok("consolidate", src, out2, "--max-shard-size", "8KB", "--no-progress")
        self.check_index(out2)
        self.assertSameTensors(sd, R.read_folder(out2))

    def test_non_canonical_input_header_accepted(self):
        # Leading/trailing whitespace, indentation, keys in any order, offsets not sorted in
        # the JSON, unknown extra metadata, no padding (data not 8-aligned).
        rng = np.random.default_rng(16)
        sd = collections.OrderedDict([
            ("z.f32", R.random_tensor(rng, "F32", (5, 3))),
            ("a.f64", R.random_tensor(rng, "F64", (4,))),
            ("m.bf16", R.random_tensor(rng, "BF16", (7,))),
            ("b.i32", R.random_tensor(rng, "I32", (3,))),
            ("e.empty", R.random_tensor(rng, "F16", (0,))),
        ])
        order = ["m.bf16", "z.f32", "e.empty", "b.i32", "a.f64"]  # data order in the file
        pos, data, entries = 0, b"", []
        for k in order:
            raw = sd[k].raw()
            entries.append((k, {"shape": list(sd[k].shape), "data_offsets": [pos, pos + len(raw)],
                                "dtype": sd[k].dtype}))
            data += raw
            pos += len(raw)
        entries.reverse()
        header = collections.OrderedDict(entries)
        header["__metadata__"] = {"format": "pt", "producer": "hand-made", "x": "y"}
        text = "  \n" + json.dumps(header, indent=3) + "\n \t"
        for pad in (False, True):
            with self.subTest(padded=pad):
                blob = R.raw_file(text, data, pad=pad)
                if not pad:
                    self.assertNotEqual((len(blob) - len(data)) % 8, 0)
                src = self.p("odd%d.safetensors" % pad)
                with open(src, "wb") as f:
                    f.write(blob)
                out = self.p("out%d" % pad)
                self.ok("consolidate", src, out, "--no-progress")
                self.check_output_folder(out, ["model.safetensors"])
                self.assertSameTensors(sd, R.read_folder(out))
                out2 = self.p("out-bf16-%d" % pad)
                self.ok("consolidate", src, out2, "--dtype", "bf16", "--no-progress")
                exp = collections.OrderedDict((k, R.convert(t, "bf16")) for k, t in sd.items())
                self.assertSameTensors(exp, R.read_folder(out2), nan_any=True)

    def test_partially_overlapping_files_rejected(self):
        sd = R.gpt_like(seed=17)
        names = list(sd)
        src = self.p("in")
        os.makedirs(src)
        R.write_file(os.path.join(src, "a.safetensors"), {k: sd[k] for k in names[:12]})
        R.write_file(os.path.join(src, "b.safetensors"), {k: sd[k] for k in names[10:]})
        out = self.p("out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out))

    def test_relative_paths_and_trailing_slash(self):
        sd = R.gpt_like(seed=18)
        self.write_model(sd, "rel.safetensors")
        cmd = [RESHARDCTL, "consolidate", "rel.safetensors", "out/", "--no-progress"]
        res = subprocess.run(cmd, cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=DEFAULT_TIMEOUT)
        self.assertEqual(res.returncode, 0, res.stderr.decode("utf-8", "replace"))
        self.check_output_folder(self.p("out"), ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(self.p("out")))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["out", "rel.safetensors"],
                         "stray files/folders next to OUT")

    def test_exact_fit_stays_in_one_file(self):
        rng = np.random.default_rng(9)
        sd = collections.OrderedDict(
            ("a%d" % i, R.random_tensor(rng, "F32", (250,))) for i in range(4))  # 4 x 1000 B
        src = self.write_model(sd)
        out = self.p("out")
        self.ok("consolidate", src, out, "--max-shard-size", "2000", "--no-progress")
        index = self.check_index(out)
        self.assertEqual(index["weight_map"], {
            "a0": R.hf_shard_name(1, 2), "a1": R.hf_shard_name(1, 2),
            "a2": R.hf_shard_name(2, 2), "a3": R.hf_shard_name(2, 2)})


class DtypeTests(Base):

    def _convert_and_check(self, target, sd):
        src = self.write_model(sd)
        out = self.p("out-" + target)
        self.ok("consolidate", src, out, "--dtype", target, "--no-progress")
        self.check_output_folder(out, ["model.safetensors"])
        got = R.read_folder(out)
        expected = collections.OrderedDict((k, R.convert(t, target)) for k, t in sd.items())
        self.assertEqual(sorted(got), sorted(expected))
        bad = []
        for k in expected:
            exp, act = expected[k], got[k]
            converted = sd[k].dtype in R.FLOAT_CONVERTIBLE and target != "keep"
            d = R.diff_tensors(exp, act, nan_any=converted)
            if d:
                bad.append("%s (%s -> %s): %s" % (k, sd[k].dtype, exp.dtype, d))
                continue
            if converted:
                nan_e = R.is_nan_bits(exp)
                nan_a = R.is_nan_bits(act)
                if not np.array_equal(nan_e, nan_a):
                    bad.append("%s: NaN positions differ" % k)
        self.assertFalse(bad, "--dtype %s wrong:\n  %s" % (target, "\n  ".join(bad[:30])))
        return got

    def test_bf16(self):
        self._convert_and_check("bf16", R.llama_like(seed=21))

    def test_fp16(self):
        self._convert_and_check("fp16", R.llama_like(seed=22))

    def test_fp32(self):
        self._convert_and_check("fp32", R.llama_like(seed=23))

    def test_keep_is_bit_exact(self):
        self._convert_and_check("keep", R.llama_like(seed=24))

    def test_bf16_rounding_edge_values(self):
        bits = R.special_f32_bits()
        # Every tie pattern around a range of exponents, both parities, both signs.
        hi = np.arange(0, 1 << 16, 37, dtype=np.uint32)
        ties = (hi << 16) | 0x8000
        near = np.concatenate([(hi << 16) | 0x7FFF, (hi << 16) | 0x8001])
        allbits = np.concatenate([bits, ties, near]).astype(np.uint32)
        sd = collections.OrderedDict([
            ("edge.f32", R.Tensor("F32", allbits.view(np.float32).copy())),
            ("edge.f16", R.Tensor("F16", np.arange(0, 1 << 16, dtype=np.uint32)
                                  .astype(np.uint16).view(np.float16).copy())),
            ("edge.bf16", R.Tensor("BF16", np.arange(0, 1 << 16, dtype=np.uint32)
                                   .astype(np.uint16))),
        ])
        for target in ("bf16", "fp16", "fp32"):
            with self.subTest(target=target):
                self._convert_and_check(target, sd)

    def test_reshard_with_dtype(self):
        sd = R.llama_like(seed=25)
        src = self.write_model(sd)
        rules = self.write_rules(R.LLAMA_RULES)
        out = self.p("out")
        self.ok("reshard", src, out, "--parts", 2, "--rules", rules, "--dtype", "bf16",
                "--no-progress")
        self.check_output_folder(out, ["model_part-0.safetensors", "model_part-1.safetensors"],
                                 parts=2)
        conv = collections.OrderedDict((k, R.convert(t, "bf16")) for k, t in sd.items())
        expected = R.split_model(conv, R.LLAMA_RULES, 2)
        for i in range(2):
            got = R.read_file(os.path.join(out, "model_part-%d.safetensors" % i))
            self.assertSameTensors(expected[i], got, nan_any=True, what="part %d" % i)


class ReshardTests(Base):

    def _split(self, sd, rules_obj, parts, src=None):
        src = src or self.write_model(sd)
        rules = self.write_rules(rules_obj)
        out = self.p("split%d" % parts)
        self.ok("reshard", src, out, "--parts", parts, "--rules", rules, "--no-progress")
        names = ["model_part-%d.safetensors" % i for i in range(parts)]
        self.check_output_folder(out, names, parts=parts)
        expected = R.split_model(sd, rules_obj, parts)
        for i, fn in enumerate(names):
            self.assertSameTensors(expected[i], R.read_file(os.path.join(out, fn)),
                                   what="part %d" % i)
        return out, rules

    def test_llama_split_merge_resplit(self):
        sd = R.llama_like(seed=31)
        parts4, rules = self._split(sd, R.LLAMA_RULES, 4)
        # parts -> consolidate with the same rules == original
        merged = self.p("merged")
        self.ok("consolidate", parts4, merged, "--rules", rules, "--no-progress")
        self.check_output_folder(merged, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(merged), what="merged 4 parts")
        # parts 4 -> 2
        parts2 = self.p("parts2")
        self.ok("reshard", parts4, parts2, "--parts", 2, "--rules", rules, "--no-progress")
        names = ["model_part-0.safetensors", "model_part-1.safetensors"]
        self.check_output_folder(parts2, names, parts=2)
        expected = R.split_model(sd, R.LLAMA_RULES, 2)
        for i, fn in enumerate(names):
            self.assertSameTensors(expected[i], R.read_file(os.path.join(parts2, fn)),
                                   what="4->2 part %d" % i)
        # verify parts against the original
        res = self.ctl("verify", parts4, merged, "--rules", rules)
        self.assertExit(res, 0)

    def test_gpt_split_and_merge(self):
        sd = R.gpt_like(seed=32)
        parts, rules = self._split(sd, R.GPT_RULES, 4)
        merged = self.p("merged")
        self.ok("consolidate", parts, merged, "--rules", rules, "--no-progress")
        self.assertSameTensors(sd, R.read_folder(merged))
        # 4 -> 8: every output part is a sub-slice of one input part.
        parts8 = self.p("parts8")
        self.ok("reshard", parts, parts8, "--parts", 8, "--rules", rules, "--no-progress")
        names = ["model_part-%d.safetensors" % i for i in range(8)]
        self.check_output_folder(parts8, names, parts=8)
        expected = R.split_model(sd, R.GPT_RULES, 8)
        for i, fn in enumerate(names):
            self.assertSameTensors(expected[i], R.read_file(os.path.join(parts8, fn)),
                                   what="4->8 part %d" % i)
        # verify works across layouts: parts vs single file vs sharded folder.
        sharded = self.p("sharded")
        self.ok("consolidate", merged, sharded, "--max-shard-size", "4KB", "--no-progress")
        self.assertExit(self.ctl("verify", parts8, sharded, "--rules", rules), 0)
        self.assertExit(self.ctl("verify", sharded, merged), 0)

    def test_natural_sort_of_parts(self):
        rng = np.random.default_rng(33)
        sd = collections.OrderedDict([
            ("w.weight", R.random_tensor(rng, "F32", (24, 4))),
            ("c.weight", R.random_tensor(rng, "BF16", (2, 36))),
            ("b.bias", R.random_tensor(rng, "F16", (5,))),
        ])
        rules_obj = {"rules": [{"pattern": r"^w\.", "split_dim": 0},
                               {"pattern": r"^c\.", "split_dim": -1},
                               {"pattern": ".*", "replicate": True}]}
        parts = R.split_model(sd, rules_obj, 12)
        src = self.write_parts(parts, fmt="shard-%d.safetensors")
        rules = self.write_rules(rules_obj)
        out = self.p("out")
        self.ok("consolidate", src, out, "--rules", rules, "--no-progress")
        self.assertSameTensors(sd, R.read_folder(out),
                               what="(parts must be ordered by natural sort: shard-2 < shard-10)")

    def test_parts_without_rules_exit_3(self):
        sd = R.llama_like(seed=34, extras=False)
        src = self.write_parts(R.split_model(sd, R.LLAMA_RULES, 4))
        out = self.p("out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertRegex(res.stderr_text.lower(), "rules", "message must mention rules")
        self.assertFalse(os.path.exists(out))
        res = self.ctl("consolidate", src, out, "--no-progress", "--json")
        self.assertExit(res, 3)
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), False)
        self.assertEqual(doc.get("exit_code"), 3)
        self.assertIn("code", doc.get("error", {}))
        self.assertIn("rules", doc["error"].get("message", "").lower())
        self.assertFalse(os.path.exists(out))

    def test_reshard_requires_divisible_dim(self):
        sd = R.llama_like(seed=35, extras=False)
        src = self.write_model(sd)
        rules = self.write_rules(R.LLAMA_RULES)
        out = self.p("out")
        res = self.ctl("reshard", src, out, "--parts", 3, "--rules", rules, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out))

    def test_tensor_matching_no_rule(self):
        sd = R.llama_like(seed=36, extras=False)
        src = self.write_model(sd)
        rules = self.write_rules({"rules": [{"pattern": "proj", "split_dim": 0}]})
        out = self.p("out")
        res = self.ctl("reshard", src, out, "--parts", 2, "--rules", rules, "--no-progress")
        self.assertExit(res, 3)
        unmatched = [k for k in sd if "proj" not in k]
        self.assertTrue(any(k in res.stderr_text for k in unmatched),
                        "error should name a tensor matching no rule" + self.describe(res))
        self.assertFalse(os.path.exists(out))

    def test_replicated_shape_mismatch_across_parts(self):
        sd = R.llama_like(seed=37, extras=False)
        parts = R.split_model(sd, R.LLAMA_RULES, 2)
        rng = np.random.default_rng(1)
        parts[1] = collections.OrderedDict(parts[1])
        parts[1]["model.norm.weight"] = R.random_tensor(rng, "F32", (17,))
        src = self.write_parts(parts)
        rules = self.write_rules(R.LLAMA_RULES)
        out = self.p("out")
        res = self.ctl("consolidate", src, out, "--rules", rules, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out))


    def test_split_dim_out_of_range(self):
        sd = R.llama_like(seed=38, extras=False)
        src = self.write_model(sd)
        for dim in (2, -3):
            with self.subTest(dim=dim):
                rules = self.write_rules({"rules": [{"pattern": "q_proj", "split_dim": dim},
                                                    {"pattern": ".*", "replicate": True}]},
                                         "rules%d.json" % dim)
                out = self.p("out%d" % dim)
                res = self.ctl("reshard", src, out, "--parts", 2, "--rules", rules,
                               "--no-progress")
                self.assertExit(res, 3)
                self.assertFalse(os.path.exists(out))

    def test_parts_disagreeing_on_split_tensor(self):
        sd = R.llama_like(seed=39, extras=False)
        rules = self.write_rules(R.LLAMA_RULES)
        rng = np.random.default_rng(2)
        name = "model.layers.0.self_attn.o_proj.weight"  # split on dim -1
        for case in ("shape", "dtype", "replicated_dtype"):
            with self.subTest(case=case):
                parts = [collections.OrderedDict(p) for p in R.split_model(sd, R.LLAMA_RULES, 2)]
                if case == "shape":
                    t = parts[1][name]
                    parts[1][name] = R.random_tensor(rng, t.dtype, (t.shape[0] + 1, t.shape[1]))
                elif case == "dtype":
                    t = parts[1][name]
                    parts[1][name] = R.Tensor("I32", t.array.view(np.int32)
                                              if t.dtype == "F32" else t.array.astype(np.int32))
                else:
                    t = parts[1]["model.norm.weight"]
                    parts[1]["model.norm.weight"] = R.Tensor("I32", t.array.view(np.int32))
                src = self.write_parts(parts, folder="parts_" + case)
                out = self.p("out_" + case)
                res = self.ctl("consolidate", src, out, "--rules", rules, "--no-progress")
                self.assertExit(res, 3)
                self.assertFalse(os.path.exists(out))


class InspectPlanVerifyTests(Base):

    def test_inspect_json_single_file(self):
        sd = R.llama_like(seed=41)
        src = self.write_model(sd, metadata={"format": "pt", "note": "hello-inspect"})
        res = self.ok("inspect", src, "--json")
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), True)
        for k in ("format", "layout", "parts", "files", "tensors", "total_bytes", "metadata"):
            self.assertIn(k, doc, "inspect --json lacks %s" % k)
        self.assertEqual(doc["layout"], "single-file")
        self.assertEqual(len(doc["files"]), 1)
        self.assertEqual(doc["files"][0]["bytes"], os.path.getsize(src))
        self.assertEqual(os.path.basename(doc["files"][0]["path"]), "model.safetensors")
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(sorted(got), sorted(sd))
        for k, t in sd.items():
            self.assertEqual(got[k]["dtype"], t.dtype, k)
            self.assertEqual(list(got[k]["shape"]), list(t.shape), k)
            self.assertEqual(got[k]["bytes"], t.nbytes, k)
        # total_bytes is the tensors' data (the file's header is not counted).
        self.assertEqual(doc["total_bytes"], sum(t.nbytes for t in sd.values()))
        self.assertIn("hello-inspect", json.dumps(doc["metadata"]))
        # Human-readable mode works too.
        res = self.ok("inspect", src)
        self.assertIn("model.embed_tokens.weight", res.stdout_text)

    def test_inspect_layouts(self):
        sd = R.llama_like(seed=42, extras=False)
        names = list(sd)
        sharded = self.p("sharded")
        R.write_sharded(sharded, sd, [names[:5], names[5:]])
        doc = self.json_of(self.ok("inspect", sharded, "--json"))
        self.assertEqual(doc["layout"], "sharded")
        self.assertEqual(len(doc["files"]), 2)
        self.assertEqual(sorted(t["name"] for t in doc["tensors"]), sorted(sd))
        parts = self.write_parts(R.split_model(sd, R.LLAMA_RULES, 4))
        doc = self.json_of(self.ok("inspect", parts, "--json"))
        self.assertEqual(doc["layout"], "model-parallel-parts")
        self.assertEqual(doc["parts"], 4)
        self.assertEqual(len(doc["files"]), 4)

    def test_inspect_parts_with_rules_shows_global_shapes(self):
        sd = R.llama_like(seed=42, extras=False)
        parts = self.write_parts(R.split_model(sd, R.LLAMA_RULES, 4))
        rules = self.write_rules(R.LLAMA_RULES)
        doc = self.json_of(self.ok("inspect", parts, "--json", "--rules", rules))
        self.assertEqual(doc["layout"], "model-parallel-parts")
        got = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(sorted(got), sorted(sd))
        for k, t in sd.items():
            self.assertEqual(list(got[k]["shape"]), list(t.shape),
                             "inspect --rules should show merged (global) shapes: %s" % k)

    def test_plan_json_consolidate(self):
        sd = R.llama_like(seed=43, hidden=32, inter=64, vocab=40)
        src = self.write_model(sd)
        res = self.ok("plan", src, "--max-shard-size", "4KB", "--json")
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), True)
        for k in ("files", "total_bytes", "memory_bytes"):
            self.assertIn(k, doc, "plan --json lacks %s" % k)
        self.assertIsInstance(doc["memory_bytes"], int)
        self.assertGreater(doc["memory_bytes"], 0)
        out = self.p("out")
        self.ok("consolidate", src, out, "--max-shard-size", "4KB", "--no-progress")
        actual = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        planned = sorted(os.path.basename(f["name"]) for f in doc["files"]
                         if f["name"].endswith(".safetensors"))
        self.assertEqual(planned, actual, "plan must predict the output files")
        for f in doc["files"]:
            fn = os.path.basename(f["name"])
            if not fn.endswith(".safetensors"):
                continue
            tensors = R.read_file(os.path.join(out, fn))
            # A planned file's bytes are the whole file's, header included.
            self.assertEqual(f["bytes"], os.path.getsize(os.path.join(out, fn)),
                             "plan bytes for %s" % fn)
            self.assertEqual(f["tensors"], len(tensors), "plan tensor count for %s" % fn)
        # total_bytes: the data files' sizes (the index is listed with its own bytes).
        file_total = sum(os.path.getsize(os.path.join(out, f)) for f in actual)
        self.assertEqual(doc["total_bytes"], file_total)

    def test_plan_json_parts_and_dtype(self):
        sd = R.llama_like(seed=44)
        src = self.write_model(sd)
        rules = self.write_rules(R.LLAMA_RULES)
        doc = self.json_of(self.ok("plan", src, "--parts", 4, "--rules", rules, "--json"))
        self.assertEqual(sorted(os.path.basename(f["name"]) for f in doc["files"]),
                         ["model_part-%d.safetensors" % i for i in range(4)])
        keep = self.json_of(self.ok("plan", src, "--json"))
        half = self.json_of(self.ok("plan", src, "--dtype", "bf16", "--json"))
        self.assertLess(half["total_bytes"], keep["total_bytes"])
        # total_bytes is the planned data files' whole sizes, headers included: exactly what the
        # same conversion then writes.
        for doc, extra, name in ((keep, (), "keep"), (half, ("--dtype", "bf16"), "bf16")):
            out = self.p("out-" + name)
            self.ok("consolidate", src, out, *extra, "--no-progress")
            written = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                          if f.endswith(".safetensors"))
            self.assertEqual(doc["total_bytes"], written, "plan total_bytes (%s)" % name)

    def test_verify(self):
        sd = R.llama_like(seed=45)
        a = self.write_model(sd, "a.safetensors")
        b = self.write_model(sd, "b.safetensors")
        res = self.ctl("verify", a, b, "--json")
        self.assertExit(res, 0)
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), True)
        self.assertIs(doc.get("equal"), True)
        self.assertEqual(doc.get("tensors_compared"), len(sd))
        self.assertEqual(doc.get("mismatched"), [])
        self.assertEqual(doc.get("only_in_a"), [])
        self.assertEqual(doc.get("only_in_b"), [])
        self.assertEqual(doc.get("elements_compared"), sum(t.array.size for t in sd.values()))
        self.assertEqual(doc.get("tolerance"),
                         "same dtype: bit-exact (NaN == NaN); F32/F16/BF16 pairs: the finer side "
                         "rounded to the coarser with round-to-nearest-even must be bit-exact")
        self.assertExit(self.ctl("verify", a, b), 0)

        # One flipped element.
        flipped = collections.OrderedDict(sd)
        t = sd["extra.odd_f32"]
        arr = t.array.copy().reshape(-1)
        idx = int(np.flatnonzero(np.isfinite(arr))[50])
        arr.view(np.uint32)[idx] ^= 1
        flipped["extra.odd_f32"] = R.Tensor("F32", arr.reshape(t.shape))
        c = self.write_model(flipped, "c.safetensors")
        res = self.ctl("verify", a, c)
        self.assertExit(res, 4)
        res = self.ctl("verify", a, c, "--json")
        self.assertExit(res, 4)
        doc = self.json_of(res)
        self.assertIs(doc.get("equal"), False)
        self.assertEqual(doc.get("tensors_compared"), len(sd))
        self.assertEqual(len(doc["mismatched"]), 1, doc["mismatched"])
        mismatch = doc["mismatched"][0]
        self.assertEqual(mismatch["name"], "extra.odd_f32")
        self.assertEqual(mismatch["reason"], "values differ (compared as F32)")
        self.assertEqual(mismatch["mismatches"], 1)
        self.assertEqual(mismatch["first_index"], idx)
        # The flipped bit is bit 0 of the element: its first byte, at the same offset of both
        # files (same header).
        self.assertEqual(mismatch["first_byte"], 4 * idx)
        offset = self.data_offset(a, "extra.odd_f32") + 4 * idx
        self.assertEqual((mismatch["a_file"], mismatch["a_offset"]), (a, offset))
        self.assertEqual((mismatch["b_file"], mismatch["b_offset"]), (c, offset))
        self.assertEqual(doc.get("only_in_a"), [])
        self.assertEqual(doc.get("only_in_b"), [])

        # Against a bf16 copy whose element differs in its high byte: A is rounded to bf16
        # before comparing, so A's offset is its element's first byte; B's is the byte itself.
        half = collections.OrderedDict(sd)
        rounded = R.bf16_rne(t.array).reshape(-1)
        rounded[idx] ^= 0x0100
        half["extra.odd_f32"] = R.Tensor("BF16", rounded.reshape(t.shape))
        e = self.write_model(half, "e.safetensors")
        res = self.ctl("verify", a, e, "--json")
        self.assertExit(res, 4)
        (m,) = self.json_of(res)["mismatched"]
        self.assertEqual((m["name"], m["reason"], m["first_index"], m["first_byte"]),
                         ("extra.odd_f32", "values differ (compared as BF16)", idx, 2 * idx + 1))
        self.assertEqual((m["a_file"], m["a_offset"]), (a, offset))
        self.assertEqual((m["b_file"], m["b_offset"]),
                         (e, self.data_offset(e, "extra.odd_f32") + 2 * idx + 1))

        # Missing tensor in B.
        less = collections.OrderedDict(sd)
        del less["extra.i16"]
        d = self.write_model(less, "d.safetensors")
        res = self.ctl("verify", a, d, "--json")
        self.assertExit(res, 4)
        doc = self.json_of(res)
        self.assertEqual(doc["only_in_a"], ["extra.i16"])
        self.assertEqual(doc["only_in_b"], [])

    def test_verify_bit_exact_zero_sign_and_nan(self):
        base = np.array([1.0, 0.0, np.nan, 2.0], dtype=np.float32)
        other = base.copy()
        other.view(np.uint32)[2] = 0x7FC00001  # another NaN: equal
        a = self.write_model({"x": R.Tensor("F32", base)}, "a.safetensors")
        b = self.write_model({"x": R.Tensor("F32", other)}, "b.safetensors")
        self.assertExit(self.ctl("verify", a, b), 0)
        neg = base.copy()
        neg[1] = -0.0  # -0.0 == 0.0 numerically but not bit-exact
        c = self.write_model({"x": R.Tensor("F32", neg)}, "c.safetensors")
        self.assertExit(self.ctl("verify", a, c), 4)
        ints = self.write_model({"x": R.Tensor("I32", np.array([1, 0, 3, 2], np.int32))},
                                "i.safetensors")
        res = self.ctl("verify", a, ints)
        self.assertExit(res, 4)
        shape = self.write_model({"x": R.Tensor("F32", base.reshape(2, 2))}, "s.safetensors")
        self.assertExit(self.ctl("verify", a, shape), 4)

    def test_verify_cross_dtype_tolerance(self):
        # F16 vs BF16 has no "finer side", so the model holds no F16 tensors here.
        sd = collections.OrderedDict(
            (k, t) for k, t in R.llama_like(seed=46).items() if t.dtype != "F16")
        src = self.write_model(sd)
        out16 = self.p("fp16")
        sd16 = collections.OrderedDict((k, t) for k, t in sd.items() if t.dtype != "BF16")
        src16 = self.write_model(sd16, "model16.safetensors")
        self.ok("consolidate", src16, out16, "--dtype", "fp16", "--no-progress")
        res = self.ctl("verify", src16, out16, "--json")
        self.assertExit(res, 0)
        self.assertIs(self.json_of(res)["equal"], True)
        out = self.p("bf16")
        self.ok("consolidate", src, out, "--dtype", "bf16", "--no-progress")
        res = self.ctl("verify", src, out, "--json")
        self.assertExit(res, 0)
        self.assertIs(self.json_of(res)["equal"], True)
        # Off by one ulp in one bf16 element -> difference.
        conv = R.read_folder(out)
        t = conv["model.norm.weight"]
        arr = t.array.copy()
        i = int(np.flatnonzero(np.isfinite(R.bf16_to_f32(arr)))[0])
        arr.reshape(-1)[i] ^= 1
        conv["model.norm.weight"] = R.Tensor("BF16", arr)
        bad = self.write_model(conv, "bad.safetensors")
        res = self.ctl("verify", src, bad, "--json")
        self.assertExit(res, 4)
        doc = self.json_of(res)
        self.assertEqual([m["name"] for m in doc["mismatched"]], ["model.norm.weight"])


class OutputFolderTests(Base):

    def _model(self):
        sd = R.gpt_like(seed=51)
        return sd, self.write_model(sd)

    def test_non_empty_output_refused_and_untouched(self):
        sd, src = self._model()
        out = self.p("out")
        os.makedirs(os.path.join(out, "sub"))
        with open(os.path.join(out, "keep.txt"), "w") as f:
            f.write("precious")
        with open(os.path.join(out, "model.safetensors"), "w") as f:
            f.write("not a model")
        before = {}
        for root, dirs, files in os.walk(out):
            for n in dirs + files:
                path = os.path.join(root, n)
                st = os.lstat(path)
                data = read_bytes(path) if os.path.isfile(path) else None
                before[path] = (st.st_mtime_ns, st.st_size, data)
        time.sleep(0.01)
        for cmd in (["consolidate", src, out, "--no-progress"],
                    ["reshard", src, out, "--parts", 2, "--rules",
                     self.write_rules(R.GPT_RULES), "--no-progress"]):
            with self.subTest(cmd=cmd[0]):
                res = self.ctl(*cmd)
                self.assertExit(res, 3)
                after = {}
                for root, dirs, files in os.walk(out):
                    for n in dirs + files:
                        path = os.path.join(root, n)
                        st = os.lstat(path)
                        data = read_bytes(path) if os.path.isfile(path) else None
                        after[path] = (st.st_mtime_ns, st.st_size, data)
                self.assertEqual(after, before, "non-empty OUT was modified")
                self.assertFalse(os.path.exists(staging_path(out)))

    def test_output_is_a_regular_file(self):
        sd, src = self._model()
        out = self.p("out")
        with open(out, "w") as f:
            f.write("x")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertEqual(read_bytes(out), b"x")

    def test_existing_empty_output_ok(self):
        sd, src = self._model()
        out = self.p("out")
        os.makedirs(out)
        self.ok("consolidate", src, out, "--no-progress")
        self.check_output_folder(out, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(out))

    def test_no_staging_left_and_stale_staging_removed(self):
        sd, src = self._model()
        out = self.p("out")
        stale = staging_path(out)
        os.makedirs(stale)
        with open(os.path.join(stale, "model.safetensors"), "wb") as f:
            f.write(b"\0" * 100)
        self.ok("consolidate", src, out, "--no-progress")
        self.assertFalse(os.path.exists(stale), "stale staging folder not removed")
        self.check_output_folder(out, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(out))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["model.safetensors", "out"])

    def test_non_utf8_paths_do_not_crash(self):
        # Linux paths are bytes; one that is not UTF-8 is a valid path: reshard converts it
        # (exit 0), and the JSON document shows the bytes that are not UTF-8 as U+FFFD instead of
        # aborting the JSON/manifest writers.
        sd = R.gpt_like(seed=52)
        d = os.path.join(self.tmp, os.fsdecode(b"dir\xff"))
        os.makedirs(d)
        src = os.path.join(d, "m.safetensors")
        R.write_file(src, sd)
        shown = os.path.join(self.tmp, "dir\ufffd", "m.safetensors")
        for j, extra in enumerate([[], ["--json"]]):
            with self.subTest(json=bool(extra)):
                out = self.p("out%d" % j)
                res = self.ctl("consolidate", src, out, "--no-progress", *extra)
                self.assertEqual(res.returncode, 0, self.describe(res))
                if extra:
                    doc = self.json_of(res)
                    self.assertEqual(doc["input"], shown)
                    self.assertEqual(doc["output"], out)
                self.check_output_folder(out, ["model.safetensors"])
                self.assertSameTensors(sd, R.read_folder(out))
        res = self.ctl("inspect", src, "--json")
        self.assertEqual(res.returncode, 0, self.describe(res))
        doc = self.json_of(res)
        self.assertEqual(doc["path"], shown)
        self.assertEqual(doc["tensor_count"], len(sd))
        out = os.path.join(d, "out")  # OUT itself under a non-UTF-8 folder
        res = self.ctl("consolidate", self.write_model(sd), out, "--no-progress")
        self.assertEqual(res.returncode, 0, self.describe(res))
        self.check_output_folder(out, ["model.safetensors"])
        self.assertSameTensors(sd, R.read_folder(out))

    def test_usage_errors_exit_2(self):
        sd, src = self._model()
        for args in (["frobnicate"], ["consolidate"], ["consolidate", src],
                     ["consolidate", src, self.p("o1"), "--no-such-flag"],
                     ["consolidate", src, self.p("o2"), "--threads"]):
            with self.subTest(args=args):
                res = self.ctl(*args)
                self.assertExit(res, 2)

    def test_bad_option_values_exit_2(self):
        # A value no option takes is a usage error (exit 2), found before anything is read.
        sd, src = self._model()
        for args in (["consolidate", src, self.p("o1"), "--dtype", "fp8"],
                     ["consolidate", src, self.p("o2"), "--max-shard-size", "12XB"],
                     ["consolidate", src, self.p("o3"), "--max-shard-size", "-5"],
                     ["consolidate", src, self.p("o4"), "--threads", "zero"],
                     ["reshard", src, self.p("o5"), "--parts", "0", "--rules",
                      self.write_rules(R.GPT_RULES)]):
            with self.subTest(args=args[3:]):
                res = self.ctl(*args)
                self.assertExit(res, 2)
                self.assertFalse(os.path.exists(args[2]))


# ----------------------------------------------------------------------------------------------


def _good_header(shape=(2,), dtype="F32"):
    n = R.nbytes_of(dtype, shape)
    return {"__metadata__": {"format": "pt"},
            "t": {"dtype": dtype, "shape": list(shape), "data_offsets": [0, n]}}


def corrupt_cases():
    """name -> (bytes, problem regex)"""
    cases = collections.OrderedDict()
    valid = R.build_bytes({"a.weight": R.Tensor("F32", np.arange(6, dtype=np.float32)),
                           "b.bias": R.Tensor("F16", np.arange(4, dtype=np.float16))})
    cases["truncated_tiny"] = (valid[:5],
                               r"truncat|too (small|short)|short|8 bytes|eof|end of file|header")
    cases["truncated_data"] = (valid[:-3],
                               r"truncat|short|incomplete|eof|end of file|past|beyond|exceed|"
                               r"buffer|size|length|offset")
    cases["header_past_eof"] = (R.raw_file(_good_header(), b"\0" * 8, header_len=4096),
                                r"header|length|eof|end of file|past|beyond|exceed|truncat")
    cases["header_too_large"] = (R.raw_file(_good_header(), b"\0" * 8, header_len=100_000_001),
                                 r"too large|too big|exceed|limit|100000000|100,000,000|max")
    cases["overlapping_offsets"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
        r"overlap|offset|contiguous")
    cases["gap_between_offsets"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
        r"gap|hole|offset|contiguous")
    cases["trailing_bytes"] = (valid + b"\0\0\0\0",
                               r"trailing|extra|offset|buffer|size|length|exceed|remain|end")
    cases["unknown_dtype"] = (R.raw_file({
        "a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        r"dtype|data type|Q7")
    cases["shape_dtype_bytes_mismatch"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
        r"shape|size|bytes|length|offset")
    cases["invalid_json"] = (R.raw_file('{"a": {"dtype": "F32", "shape": [2], "data_off', b""),
                             r"json|parse|syntax")
    cases["invalid_utf8"] = (R.raw_file(
        b'{"__metadata__":{"format":"pt","x":"\xff\xfe"},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        r"utf-?8|encoding|unicode")
    cases["duplicate_tensor_names"] = (R.raw_file(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        r"duplicate|twice|more than once|repeated")
    cases["metadata_non_string"] = (R.raw_file(
        '{"__metadata__":{"format":"pt","step":5},'
        '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        r"metadata|string")
    cases["header_not_object"] = (R.raw_file('[1,2,3]', b""), r"json|object|header")
    cases["negative_shape"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
        r"shape|negative|dimension")
    cases["shape_overflow"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [1 << 62, 1 << 62, 4], "data_offsets": [0, 8]}},
        b"\0" * 8), r"overflow|too large|shape|size|bytes")
    cases["shape_not_integer"] = (R.raw_file(
        '{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}', b"\0" * 4),
        r"shape|integer")
    cases["offsets_reversed"] = (R.raw_file({
        "a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        r"offset")
    cases["offset_beyond_u64"] = (R.raw_file(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,100000000000000000000000000000]}}',
        b"\0" * 4), r"offset|range|integer|large|overflow|number")
    cases["empty_header"] = (struct.pack("<Q", 0), r"json|empty|header")
    cases["tensor_not_object"] = (R.raw_file('{"a":null}', b""), r"object|tensor|\"a\"|null")
    cases["missing_dtype_field"] = (R.raw_file(
        '{"a":{"shape":[1],"data_offsets":[0,4]}}', b"\0" * 4), r"dtype")
    return cases


class CorruptInputTests(Base):

    def _expect_rejected(self, src, name_in_msg, problem_re, extra_names=(), any_of=()):
        for cmd in ("consolidate", "inspect"):
            out = self.p("out-" + cmd)
            if cmd == "consolidate":
                res = self.ctl("consolidate", src, out, "--no-progress")
            else:
                res = self.ctl("inspect", src)
            self.assertExit(res, 3)
            err = res.stderr_text
            self.assertIn(name_in_msg, err,
                          "%s: message must name the file%s" % (cmd, self.describe(res)))
            for n in extra_names:
                self.assertIn(n, err, "%s: message must name %s%s" % (cmd, n, self.describe(res)))
            if any_of:
                self.assertTrue(any(n in err for n in any_of), "%s: message must name one of %s%s"
                                % (cmd, list(any_of), self.describe(res)))
            self.assertRegex(err.lower(), problem_re.lower(),
                             "%s: message must name the problem%s" % (cmd, self.describe(res)))
            self.assertFalse(os.path.exists(out), "OUT created on invalid input")
        # --json failure document
        out = self.p("out-json")
        res = self.ctl("consolidate", src, out, "--no-progress", "--json")
        self.assertExit(res, 3)
        doc = self.json_of(res)
        self.assertIs(doc.get("ok"), False)
        self.assertEqual(doc.get("exit_code"), 3)
        self.assertIn(name_in_msg, doc.get("error", {}).get("message", ""))
        self.assertFalse(os.path.exists(out))

    def test_corrupt_single_files(self):
        for case, (data, problem) in corrupt_cases().items():
            with self.subTest(case=case):
                fn = "bad_%s.safetensors" % case
                path = self.p(fn)
                with open(path, "wb") as f:
                    f.write(data)
                self._expect_rejected(path, fn, problem)
                os.remove(path)

    def test_corrupt_file_inside_sharded_folder(self):
        # The bad file is the last shard: nothing may be written before validation finishes.
        sd = R.gpt_like(seed=61)
        names = list(sd)
        src = self.p("in")
        R.write_sharded(src, sd, [names[:8], names[8:16], names[16:]])
        bad = os.path.join(src, R.hf_shard_name(3, 3))
        with open(bad, "ab") as f:
            f.write(b"\0" * 16)
        self._expect_rejected(src, R.hf_shard_name(3, 3), r"trailing|extra|size|length|buffer|"
                              r"offset|exceed|remain|end")

    def test_index_names_missing_file(self):
        sd = R.gpt_like(seed=62)
        names = list(sd)
        src = self.p("in")
        R.write_sharded(src, sd, [names[:10], names[10:]])
        index = R.read_index(src)
        index["weight_map"][names[-1]] = "model-00009-of-00009.safetensors"
        with open(os.path.join(src, R.INDEX_NAME), "w") as f:
            json.dump(index, f)
        self._expect_rejected(src, "model-00009-of-00009.safetensors",
                              r"missing|not found|no such|does not exist|cannot open|exist|"
                              r"open|not in")

    def test_index_names_tensor_not_in_file(self):
        sd = R.gpt_like(seed=63)
        names = list(sd)
        src = self.p("in")
        R.write_sharded(src, sd, [names[:10], names[10:]])
        index = R.read_index(src)
        index["weight_map"]["ghost.weight"] = R.hf_shard_name(1, 2)
        with open(os.path.join(src, R.INDEX_NAME), "w") as f:
            json.dump(index, f)
        self._expect_rejected(src, "ghost.weight", r"missing|not found|not in|absent|does not|"
                              r"no tensor|index",
                              any_of=(R.hf_shard_name(1, 2), R.INDEX_NAME))

    def test_index_invalid_json(self):
        sd = R.gpt_like(seed=64)
        names = list(sd)
        src = self.p("in")
        R.write_sharded(src, sd, [names[:10], names[10:]])
        with open(os.path.join(src, R.INDEX_NAME), "w") as f:
            f.write('{"metadata": {"total_size": 1}, "weight_map": {')
        self._expect_rejected(src, R.INDEX_NAME, r"json|parse|syntax")

    def test_bad_rules_file(self):
        sd = R.gpt_like(seed=65)
        src = self.write_model(sd)
        for case, content in [("bad_json", "{rules: ["),
                              ("bad_regex", json.dumps({"rules": [{"pattern": "(", "split_dim": 0}]})),
                              ("no_action", json.dumps({"rules": [{"pattern": ".*"}]}))]:
            with self.subTest(case=case):
                rules = self.p("rules_%s.json" % case)
                with open(rules, "w") as f:
                    f.write(content)
                out = self.p("out_" + case)
                res = self.ctl("reshard", src, out, "--parts", 2, "--rules", rules,
                               "--no-progress")
                self.assertExit(res, 3)
                self.assertIn("rules_%s.json" % case, res.stderr_text, self.describe(res))
                self.assertFalse(os.path.exists(out))

    def test_missing_input(self):
        out = self.p("out")
        res = self.ctl("consolidate", self.p("nope.safetensors"), out, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn("nope.safetensors", res.stderr_text)
        self.assertFalse(os.path.exists(out))
        good = self.write_model(R.gpt_like(seed=66))
        res = self.ctl("verify", good, self.p("nope2.safetensors"), "--json")
        self.assertExit(res, 3)
        self.assertIs(self.json_of(res).get("ok"), False)
        self.assertIn("nope2.safetensors", res.stderr_text)


# ----------------------------------------------------------------------------------------------


def big_model(folder, total_mb=300, files=3, seed=71):
    """~total_mb MB of random F32/BF16/U8 tensors as an HF sharded folder. Returns expected raw
    bytes per tensor name (for a cheap comparison)."""
    rng = np.random.default_rng(seed)
    sd = collections.OrderedDict()
    per = 10 * 1000 * 1000
    i = 0
    while len(sd) * per < total_mb * 1000 * 1000:
        kind = ["F32", "BF16", "U8"][i % 3]
        raw = rng.bytes(per)
        storage = R.DTYPES[kind][1]
        arr = np.frombuffer(raw, dtype=storage)
        sd["layer.%03d.%s" % (i, kind.lower())] = R.Tensor(kind, arr.reshape(-1, 1000))
        i += 1
    names = list(sd)
    groups = [names[j::files] for j in range(files)]
    R.write_sharded(folder, sd, groups)
    return sd


class KillTests(Base):

    def _interrupt(self, cmd, out, sig):
        """Runs `cmd` and sends it `sig` once it writes a data file into its staging folder
        (a conversion of ~300 MB with 1 MiB windows is then far from done). Returns the exit
        status, stderr and the seconds from start to the signal."""
        staging = staging_path(out)

        def writing():
            try:
                return any(n.endswith(".safetensors") for n in os.listdir(staging))
            except OSError:
                return False

        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            while not writing():
                if proc.poll() is not None:
                    self.fail("exited %d before writing into %s: %s" % (
                        proc.returncode, staging, tail(proc.stderr.read().decode())))
                if time.monotonic() - start > 60:
                    self.fail("no data file in %s after 60 s" % staging)
                time.sleep(0.002)  # polls the condition; the deadline above bounds it
            delay = time.monotonic() - start
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return proc.returncode, stderr.decode("utf-8", "replace"), delay

    def _check_big_output(self, out, sd):
        got = R.read_folder(out)
        self.assertEqual(sorted(got), sorted(sd))
        for k, t in sd.items():
            self.assertEqual(got[k].dtype, t.dtype, k)
            self.assertEqual(got[k].shape, t.shape, k)
            self.assertTrue(np.array_equal(got[k].array.view(np.uint8).reshape(-1),
                                           t.array.view(np.uint8).reshape(-1)), k)

    def _sigkill_case(self, extra):
        src = self.p("in")
        sd = big_model(src)
        out = self.p("out")
        cmd = [RESHARDCTL, "consolidate", src, out, "--window-size", "1MiB", "--threads", "1",
               "--no-progress"] + extra
        rc, err, delay = self._interrupt(cmd, out, signal.SIGKILL)
        self.assertEqual(rc, -signal.SIGKILL)
        self.assertFalse(os.path.exists(out), "OUT exists after SIGKILL at %.3fs" % delay)
        self.assertTrue(os.path.isdir(staging_path(out)))  # what the rerun removes
        res = self.ctl(*cmd[1:], timeout=300)
        self.assertExit(res, 0)
        self.assertFalse(os.path.exists(staging_path(out)), "stale staging not cleaned by rerun")
        self.check_output_folder(out)
        self._check_big_output(out, sd)

    def test_sigkill_then_rerun_single_file(self):
        self._sigkill_case([])

    def test_sigkill_then_rerun_sharded_output(self):
        self._sigkill_case(["--max-shard-size", "100MB"])

    def test_sigint_cancels_with_exit_5(self):
        src = self.p("in")
        big_model(src, total_mb=200)
        out = self.p("out")
        cmd = [RESHARDCTL, "consolidate", src, out, "--window-size", "1MiB", "--threads", "1",
               "--no-progress"]
        rc, err, delay = self._interrupt(cmd, out, signal.SIGINT)
        self.assertEqual(rc, 5, "SIGINT must cancel with exit 5; stderr: %s" % tail(err))
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(staging_path(out)))

    def test_sigterm_cancels_with_exit_5(self):
        src = self.p("in")
        big_model(src, total_mb=200)
        out = self.p("out")
        cmd = [RESHARDCTL, "consolidate", src, out, "--window-size", "1MiB", "--threads", "1",
               "--no-progress"]
        rc, err, delay = self._interrupt(cmd, out, signal.SIGTERM)
        self.assertEqual(rc, 5, "SIGTERM must cancel with exit 5; stderr: %s" % tail(err))
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(staging_path(out)))


# ----------------------------------------------------------------------------------------------


def torch_dtype(name):
    import torch
    return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
            "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.uint8,
            "F8_E5M2": torch.uint8}[name]


def torch_from_raw(raw, dtype, shape):
    import torch
    td = torch_dtype(dtype)
    if len(raw) == 0:
        return torch.empty(tuple(shape), dtype=td)
    return torch.frombuffer(bytearray(raw), dtype=td).reshape(tuple(shape))


def torch_bits(t):
    import torch
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}
    return t.view(bits[t.dtype]) if t.dtype in bits else t


class TorchInteropTests(Base):

    def setUp(self):
        super().setUp()
        import torch  # noqa: F401  -- must be present: a missing torch is a failure, not a skip
        self.torch = torch

    def _assert_torch_equal(self, expected, actual, what):
        torch = self.torch
        self.assertEqual(expected.dtype, actual.dtype, what)
        self.assertEqual(tuple(expected.shape), tuple(actual.shape), what)
        if expected.is_floating_point():
            en = torch.isnan(expected)
            an = torch.isnan(actual)
            self.assertTrue(torch.equal(en, an), "%s: NaN positions differ" % what)
            eb = torch_bits(expected)[~en]
            ab = torch_bits(actual)[~an]
            if not torch.equal(eb, ab):
                i = int(torch.nonzero(eb != ab)[0][0])
                self.fail("%s: bits differ (first non-NaN mismatch #%d: got 0x%x want 0x%x)" % (
                    what, i, int(ab[i]) & 0xFFFFFFFF, int(eb[i]) & 0xFFFFFFFF))
        else:
            self.assertTrue(torch.equal(expected, actual), what)

    def _convert_vs_torch(self, target, tdtype):
        torch = self.torch
        sd = R.llama_like(seed=81)
        src = self.write_model(sd)
        out = self.p("out")
        self.ok("consolidate", src, out, "--dtype", target, "--no-progress")
        got = R.read_folder(out)
        for k, t in sd.items():
            g = got[k]
            actual = torch_from_raw(g.raw(), g.dtype, g.shape)
            if t.dtype in R.FLOAT_CONVERTIBLE:
                if t.dtype == "BF16":
                    orig = torch_from_raw(t.raw(), "BF16", t.shape)
                else:
                    orig = torch.from_numpy(t.array.copy())
                expected = orig.to(tdtype)
            else:
                expected = torch_from_raw(t.raw(), t.dtype, t.shape)
            self._assert_torch_equal(expected, actual, "%s (%s -> %s)" % (k, t.dtype, target))

    def test_bf16_matches_torch(self):
        self._convert_vs_torch("bf16", self.torch.bfloat16)

    def test_fp16_matches_torch(self):
        self._convert_vs_torch("fp16", self.torch.float16)

    def test_fp32_matches_torch(self):
        self._convert_vs_torch("fp32", self.torch.float32)

    def test_bf16_edge_values_match_torch(self):
        torch = self.torch
        hi = np.arange(0, 1 << 16, dtype=np.uint32)
        bits = np.concatenate([R.special_f32_bits(), (hi << 16) | 0x8000, (hi << 16) | 0x7FFF,
                               (hi << 16) | 0x8001, (hi << 16)]).astype(np.uint32)
        f32 = bits.view(np.float32)
        src = self.write_model({"x": R.Tensor("F32", f32)})
        out = self.p("out")
        self.ok("consolidate", src, out, "--dtype", "bf16", "--no-progress")
        g = R.read_folder(out)["x"]
        actual = torch_from_raw(g.raw(), "BF16", g.shape)
        expected = torch.from_numpy(f32.copy()).to(torch.bfloat16)
        self._assert_torch_equal(expected, actual, "all bf16 ties vs torch")

    def test_torch_reads_all_dtypes_of_resharded_parts(self):
        torch = self.torch
        sd = R.llama_like(seed=82)
        src = self.write_model(sd)
        rules = self.write_rules(R.LLAMA_RULES)
        out = self.p("parts")
        self.ok("reshard", src, out, "--parts", 2, "--rules", rules, "--no-progress")
        parts = [R.read_file(os.path.join(out, "model_part-%d.safetensors" % i))
                 for i in range(2)]
        for k, t in sd.items():
            r = R.rule_for(R.LLAMA_RULES, k)
            pieces = [torch_from_raw(p[k].raw(), p[k].dtype, p[k].shape) for p in parts]
            whole = (pieces[0] if r.get("replicate")
                     else torch.cat(pieces, dim=r["split_dim"]))
            expected = torch_from_raw(t.raw(), t.dtype, t.shape)
            if t.dtype in ("F32", "F64", "F16", "BF16"):
                self.assertTrue(torch.equal(torch_bits(whole), torch_bits(expected)), k)
            else:
                self.assertTrue(torch.equal(whole, expected), k)


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
