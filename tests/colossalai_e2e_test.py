"""End-to-end tests of reshard's ColossalAI distributed checkpoint reader against real torch.

Run:  /usr/bin/python3 tests/colossalai_e2e_test.py --reshardctl PATH [unittest args]

Checkpoints are written here as ColossalAI's PR #6181 (distributed_checkpoint_utils.py,
`booster.save_model(..., gather_dtensor=False)` with HybridParallelPlugin) writes them: every
(tp, pp) rank saves its local parameters (torch.save `.bin` in unsharded mode, safetensors
shards in sharded mode) and `pytorch_model-meta-dist-{dist_id:05d}.json|.index.json` with
`offsets`, `lengths`, `global_shape`, `file`, `rank` per parameter, computed as the PR's
create_model_metadata does (the tensor-parallel dim is the first whose global size exceeds the
local one; the last rank's `lengths` drop the vocabulary padding). Unsharded saves record the
saving machine's absolute path as `file`. Buffers are saved but not described, as in the PR.
reshardctl consolidates and reshards them; every tensor is compared element by element with
torch.equal against the global model the test sharded; `verify` compares the replicated copies.
Incomplete and hostile checkpoints must exit 3 naming the problem and never create OUT.
"""

import json
import os
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
import st_torch  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip

RESHARDCTL = None
SAVING_MACHINE = "/mnt/cluster/run-17/checkpoints/step-100"


def global_model(seed):
    """A small GPT-like model: embedding with a vocabulary to pad, column- and row-parallel
    linears, replicated norms, bf16 and fp16 weights."""
    g = torch.Generator().manual_seed(seed)
    sd = {"embed.weight": torch.randn(50, 16, generator=g)}
    for i in range(2):
        p = "layers.%d." % i
        sd[p + "qkv.weight"] = torch.randn(48, 16, generator=g)
        sd[p + "qkv.bias"] = torch.randn(48, generator=g)
        sd[p + "out.weight"] = torch.randn(16, 16, generator=g)
        sd[p + "fc1.weight"] = (torch.randn(64, 16, generator=g) * 10).to(torch.bfloat16)
        sd[p + "fc2.weight"] = torch.randn(16, 64, generator=g).to(torch.float16)
        sd[p + "norm.weight"] = torch.ones(16) + 0.01 * torch.randn(16, generator=g)
    sd["final_norm.weight"] = torch.randn(16, generator=g)
    return sd


# Tensor-parallel dim of each parameter (ShardFormer's column / row / vocab parallel layers).
SPLIT = [("embed.weight", 0), ("qkv.weight", 0), ("qkv.bias", 0), ("out.weight", 1),
         ("fc1.weight", 0), ("fc2.weight", 1)]
VOCAB_MULTIPLE = 8


def split_dim(name):
    for suffix, dim in SPLIT:
        if name.endswith(suffix):
            return dim
    return None


def local_tensor(name, t, tp, tp_rank, g):
    """The rank's local parameter: a chunk along the split dim; the vocabulary is padded to a
    multiple of VOCAB_MULTIPLE * tp first (random padding rows, which must never be read)."""
    dim = split_dim(name)
    if dim is None:
        return t.clone()
    if name == "embed.weight":
        multiple = VOCAB_MULTIPLE * tp
        padded = (t.shape[0] + multiple - 1) // multiple * multiple
        pad = torch.randn(padded - t.shape[0], t.shape[1], generator=g).to(t.dtype) * 1e6
        t = torch.cat([t, pad])
    return t.chunk(tp, dim)[tp_rank].clone()


def create_model_metadata(local_sd, origin_shapes, tp, tp_rank):
    """distributed_checkpoint_utils.create_model_metadata."""
    meta = {}
    for name, param in local_sd.items():
        original = list(origin_shapes[name])
        dim = None
        for d, length in enumerate(original):  # search_tp_partition_dim
            if length > param.shape[d]:
                dim = d
                break
        entry = {"offsets": [0] * len(original), "lengths": list(param.shape),
                 "global_shape": original}
        if dim is not None:
            size = param.shape[dim]
            entry["offsets"][dim] = size * tp_rank
            if tp_rank == tp - 1:
                entry["lengths"][dim] = original[dim] - size * (tp - 1)
        meta[name] = entry
    return meta


def save_colossal(folder, model, tp, pp, sharded=False, seed=0):
    """Writes `model` as tp x pp ranks of a ColossalAI distributed checkpoint into `folder`.
    Returns {dist_id: [weight file names]}."""
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1000)
    names = list(model)
    stages = [names[i * len(names) // pp:(i + 1) * len(names) // pp] for i in range(pp)]
    files = {}
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            dist_id = tp * pp_rank + tp_rank
            local = {n: local_tensor(n, model[n], tp, tp_rank, g) for n in stages[pp_rank]}
            meta = create_model_metadata(local, {n: model[n].shape for n in local}, tp, tp_rank)
            # A buffer the state dict holds but the metadata (named_parameters) does not.
            weights = dict(local)
            weights["rotary.inv_freq.%d" % pp_rank] = torch.arange(8, dtype=torch.float32)
            if sharded:
                items = list(weights.items())
                half = (len(items) + 1) // 2
                shards = [dict(items[:half]), dict(items[half:])]
                names_written = []
                for idx, shard in enumerate(shards):
                    name = "model-dist-%05d-shard-%05d.safetensors" % (dist_id, idx)
                    st_torch.write_file(os.path.join(folder, name), shard)
                    names_written.append(name)
                    for n in shard:
                        if n in meta:
                            meta[n]["file"] = name  # sharded: the bare shard name
                meta_name = "pytorch_model-meta-dist-%05d.index.json" % dist_id
            else:
                name = "pytorch_model-dist-%05d.bin" % dist_id
                torch.save(weights, os.path.join(folder, name))
                names_written = [name]
                for n in meta:  # unsharded: os.path.join(checkpoint, file) on the saving machine
                    meta[n]["file"] = os.path.join(SAVING_MACHINE, name)
                meta_name = "pytorch_model-meta-dist-%05d.json" % dist_id
            for n in meta:
                meta[n]["rank"] = dist_id
            doc = {"checkpoint_version": "1.0", "total_size": None, "metadata": meta}
            with open(os.path.join(folder, meta_name), "w") as f:
                json.dump(doc, f, indent=4)
            files[dist_id] = names_written
    return files


def edit_metadata(folder, dist_id, change):
    """Applies change(doc) to dist id `dist_id`'s metadata file in `folder`."""
    path = os.path.join(folder, "pytorch_model-meta-dist-%05d.json" % dist_id)
    with open(path) as f:
        doc = json.load(f)
    change(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def assert_equal_tensors(test, expected, got):
    test.assertEqual(set(got), set(expected))
    for name, t in expected.items():
        g = got[name]
        test.assertEqual(g.dtype, t.dtype, name)
        test.assertEqual(tuple(g.shape), tuple(t.shape), name)
        test.assertTrue(torch.equal(g, t), name)


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-colossal"

    def convert(self, *args):
        res = self.ctl(*args, "--no-progress")
        self.assertExit(res, 0)
        return res

    def refused(self, src, *words):
        out = self.p("refused-out")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        # Words are looked for with the temporary folder's name (the test's name) left out.
        text = res.text.replace(self.tmp, "<tmp>")
        for word in words:
            self.assertIn(word, text, self.describe(res))
        return text


class ColossalReadTests(Base):

    def test_inspect_names_the_layout(self):
        ck = self.p("ck")
        save_colossal(ck, global_model(1), tp=2, pp=2)
        doc = self.inspect_json(ck)
        self.assertEqual(doc["format"], "colossalai-dist")
        text = json.dumps(doc)
        self.assertIn("ColossalAI distributed checkpoint", text)
        self.assertIn("4 ranks", text)
        self.assertIn("replicated copies read once", text)
        self.assertIn("rotary.inv_freq.0", text)  # listed, not read
        self.assertEqual({t["name"] for t in doc["tensors"]}, set(global_model(1)))

    def test_unsharded_torch_tp2_pp2_consolidates_exactly(self):
        model = global_model(2)
        ck = self.p("ck")
        save_colossal(ck, model, tp=2, pp=2)
        out = self.p("out")
        self.convert("consolidate", ck, out)
        assert_equal_tensors(self, model, st_torch.read_folder(out))
        pt = self.p("pt")
        self.convert("consolidate", ck, pt, "--format", "torch")
        assert_equal_tensors(self, model, torch.load(os.path.join(pt, "pytorch_model.bin")))

    def test_sharded_safetensors_tp4_consolidates_exactly(self):
        model = global_model(3)
        ck = self.p("ck")
        files = save_colossal(ck, model, tp=4, pp=1, sharded=True)
        self.assertEqual(len(files[0]), 2)
        out = self.p("out")
        self.convert("consolidate", ck, out, "--dtype", "keep")
        assert_equal_tensors(self, model, st_torch.read_folder(out))

    def test_reshard_tp4_to_2(self):
        model = global_model(4)
        ck = self.p("ck")
        save_colossal(ck, model, tp=4, pp=1)
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"pattern": "(qkv|fc1)\\.(weight|bias)$|embed", "split_dim": 0},
                                 {"pattern": "(out|fc2)\\.weight$", "split_dim": 1},
                                 {"pattern": ".*", "replicate": True}]}, f)
        out = self.p("parts")
        self.convert("reshard", ck, out, "--parts", "2", "--rules", rules)
        parts = [st_torch.read_file(os.path.join(out, "model_part-%d.safetensors" % i))
                 for i in range(2)]
        for name, t in model.items():
            dim = split_dim(name)
            if dim is None:
                self.assertTrue(torch.equal(parts[0][name], t), name)
                self.assertTrue(torch.equal(parts[1][name], t), name)
            else:
                self.assertTrue(torch.equal(torch.cat([parts[0][name], parts[1][name]], dim), t),
                                name)

    def test_absolute_file_is_looked_up_inside_the_folder(self):
        # The saving machine's path exists on this one too, holding other data: never read.
        model = global_model(5)
        ck = self.p("ck")
        save_colossal(ck, model, tp=2, pp=1)
        elsewhere = self.p("elsewhere")
        decoy = global_model(99)
        save_colossal(elsewhere, decoy, tp=2, pp=1)
        def to_elsewhere(doc):
            for entry in doc["metadata"].values():
                entry["file"] = os.path.join(elsewhere, os.path.basename(entry["file"]))
        for dist_id in range(2):
            edit_metadata(ck, dist_id, to_elsewhere)
        out = self.p("out")
        self.convert("consolidate", ck, out)
        assert_equal_tensors(self, model, st_torch.read_folder(out))


    def test_replicated_copies_are_read_once_and_compared_by_verify(self):
        model = global_model(6)
        ck = self.p("ck")
        files = save_colossal(ck, model, tp=2, pp=1)
        out = self.p("out")
        self.convert("consolidate", ck, out)
        self.assertExit(self.ctl("verify", ck, out), 0)
        # Rank 1's copy of a replicated norm changed (saved again: its CRC-32s are right).
        path = os.path.join(ck, files[1][0])
        weights = torch.load(path)
        weights["layers.1.norm.weight"][5] += 1
        torch.save(weights, path)
        out2 = self.p("out2")
        self.convert("consolidate", ck, out2)
        assert_equal_tensors(self, model, st_torch.read_folder(out2))  # rank 0's copy, read once
        for a, b in ((ck, out2), (out2, ck)):
            res = self.ctl("verify", a, b, "--json")
            self.assertExit(res, 4)
            doc = json.loads(res.stdout_text)
            self.assertEqual([(m["name"], m["mismatches"], m["first_index"])
                              for m in doc["mismatched"]],
                             [("layers.1.norm.weight (replicated copy in %s)" % path, 1, 5)])
            self.assertIn(files[0][0], doc["mismatched"][0]["reason"])


class ColossalRefusalTests(Base):

    def test_missing_last_rank_is_a_hole(self):
        ck = self.p("ck")
        files = save_colossal(ck, global_model(11), tp=2, pp=1)
        os.remove(os.path.join(ck, "pytorch_model-meta-dist-00001.json"))
        os.remove(os.path.join(ck, files[1][0]))
        self.refused(ck, '"embed.weight"', "[32, 50) x [0, 16)", "incomplete")

    def test_missing_middle_rank_metadata(self):
        ck = self.p("ck")
        save_colossal(ck, global_model(12), tp=2, pp=2)
        os.remove(os.path.join(ck, "pytorch_model-meta-dist-00001.json"))
        self.refused(ck, "dist id 1", "pytorch_model-meta-dist-00001.json", "missing")

    def test_missing_rank_weight_file(self):
        ck = self.p("ck")
        files = save_colossal(ck, global_model(13), tp=2, pp=1)
        os.remove(os.path.join(ck, files[1][0]))
        self.refused(ck, files[1][0], "is missing")

    def test_file_pointing_outside_the_folder(self):
        ck = self.p("ck")
        files = save_colossal(ck, global_model(14), tp=2, pp=1)
        # The weights moved next to the folder, and the metadata points there with "..".
        shutil.move(os.path.join(ck, files[0][0]), self.p(files[0][0]))
        def to_parent(doc):
            for entry in doc["metadata"].values():
                entry["file"] = "../" + files[0][0]
        edit_metadata(ck, 0, to_parent)
        self.refused(ck, "../" + files[0][0], "leaves the checkpoint folder")

    def test_symlink_leading_out(self):
        ck = self.p("ck")
        files = save_colossal(ck, global_model(15), tp=2, pp=1)
        shutil.move(os.path.join(ck, files[1][0]), self.p(files[1][0]))
        os.symlink(self.p(files[1][0]), os.path.join(ck, files[1][0]))
        self.refused(ck, "outside the checkpoint folder")

    def refused_after_edit(self, dist_id, name, field, value, *words):
        """A TP 2 checkpoint whose dist id's metadata sets `name`'s field[0] to `value`."""
        ck = self.p("ck")
        save_colossal(ck, global_model(16), tp=2, pp=1)
        edit_metadata(ck, dist_id, lambda doc: doc["metadata"][name][field].__setitem__(0, value))
        self.refused(ck, '"%s"' % name, *words)

    def test_overlapping_boxes(self):
        # Rank 0 holds all of the replicated norm, rank 1 claims half of it: no hole, an overlap.
        self.refused_after_edit(1, "layers.0.norm.weight", "lengths", 8, "overlap")

    def test_shifted_box_leaves_a_hole(self):
        # Rank 0 holds rows [0, 24) of qkv; rank 1 claims [20, 44): rows [44, 48) are missing.
        self.refused_after_edit(1, "layers.0.qkv.weight", "offsets", 20, "[44, 48) x [0, 16)")

    def test_ranks_disagreeing_on_the_global_shape(self):
        self.refused_after_edit(1, "layers.0.norm.weight", "global_shape", 17,
                                "global_shape [17] differs from the [16] of dist id 0")

    def test_metadata_naming_a_tensor_the_file_lacks(self):
        ck = self.p("ck")
        save_colossal(ck, global_model(17), tp=2, pp=1)
        edit_metadata(ck, 0, lambda doc: doc["metadata"].__setitem__(
            "layers.9.ghost", dict(doc["metadata"]["final_norm.weight"])))
        self.refused(ck, "pytorch_model-dist-00000.bin", '"layers.9.ghost"')

    def test_corrupt_weight_data_fails_the_crc(self):
        ck = self.p("ck")
        files = save_colossal(ck, global_model(18), tp=2, pp=1)
        harness.corrupt_largest_record(os.path.join(ck, files[1][0]))
        self.refused(ck, files[1][0], "CRC")


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
