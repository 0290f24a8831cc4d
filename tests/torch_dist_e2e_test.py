"""End-to-end tests of reshard's Megatron-Core torch_dist reader (format megatron-torch-dist)
against checkpoints written with real torch.

Run:  /usr/bin/python3 tests/torch_dist_e2e_test.py --reshardctl PATH [unittest args]

The checkpoints come from tests/fixtures/torch_dist_fixture.py: a 2-layer GPT at
tensor-parallel size 2, its transformer layers saved layer-stacked as Megatron-Core does, in a
save folder's iter_0000010/ with metadata.json. reshardctl must name the layout, unstack the
layer axis into per-layer names, carry the common state and the ShardedObjects, and refuse
incomplete folders before writing anything. Outputs are read back independently (safetensors
by tests/st_reference.py, torch by torch.load, DCP by the strict reader of
tests/dcp_output_test.py) and compared element by element.
"""

import json
import os
import pickle
import shutil
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402
import st_reference as R  # noqa: E402

import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_e2e_test as D  # noqa: E402
import dcp_fixture as F  # noqa: E402
import dcp_output_test as O  # noqa: E402
import torch_dist_fixture as M  # noqa: E402
from st_torch import TAG_OF, tensor_from_st  # noqa: E402

RESHARDCTL = None


class Base(D.Base):
    TMP_PREFIX = "reshard-torch-dist"

    def write(self, **kw):
        save = self.p("save")
        per_layer, values, common = M.write_torch_dist(save, **kw)
        return save, per_layer, values, common


class TorchDistReadTests(Base):

    def test_inspect_names_the_layout_and_per_layer_tensors(self):
        save, per_layer, values, _ = self.write()
        for path in (save, M.iteration_folder(save)):
            with self.subTest(path=path):
                doc = self.inspect_json(path)
                self.assertEqual(doc["format"], "megatron-torch-dist")
                self.assertTrue(doc["description"].startswith(
                    "Megatron-Core torch_dist, iter_0000010, 2 layers unstacked from %d "
                    "layer-stacked tensors; PyTorch DCP, 2 ranks (__0_0 .. __1_0.distcp)"
                    % len(M.LAYER_TENSORS)), doc["description"])
                got = {t["name"]: t for t in doc["tensors"]}
                self.assertEqual(sorted(got), sorted(per_layer))
                for name, t in per_layer.items():
                    self.assertEqual(got[name]["shape"], list(t.shape), name)
                    self.assertEqual(got[name]["dtype"], TAG_OF[t.dtype], name)
                # A TP-split layer tensor: one piece per rank; a replicated one: one piece.
                self.assertEqual(
                    got["decoder.layers.1.self_attention.linear_qkv.weight"]["pieces"], 2)
                self.assertEqual(
                    got["decoder.layers.1.mlp.linear_fc1.layer_norm_weight"]["pieces"], 1)
                joined = "\n".join(doc.get("other_entries", []))
                self.assertIn("common_state.iteration: int", joined)
                self.assertIn("rng_state/shard_0.1_1.2.seed: int", joined)
        self.assertIn("Megatron-Core torch_dist", self.ok("inspect", save).stdout_text)

    def test_consolidate_unstacks_layers_element_by_element(self):
        for dtype in (torch.float32, torch.bfloat16):
            with self.subTest(dtype=dtype):
                save = self.p("save-%s" % str(dtype)[6:])
                per_layer, _, _ = M.write_torch_dist(save, dtype=dtype, num_layers=3, tp=2)
                out = self.p("out-%s" % str(dtype)[6:])
                self.ok("consolidate", save, out, "--no-progress")
                got = R.read_folder(out)
                self.assertEqual(sorted(got), sorted(per_layer))
                for name, want in per_layer.items():
                    self.assertTensorEqual(tensor_from_st(got[name]), want, name)
                self.assertExit(self.ctl("verify", save, out), 0)

    def test_pipeline_stages_hold_their_layers(self):
        """TP 2 x PP 2 (4 ranks): each stage's ranks store its layers' chunks; the layer axis is
        global, so consolidation is the same unstacking."""
        save = self.p("save")
        per_layer, _, _ = M.write_torch_dist(save, tp=2, pp=2, num_layers=4)
        folder = M.iteration_folder(save)
        self.assertEqual(sorted(n for n in os.listdir(folder) if n.endswith(".distcp")),
                         ["__%d_0.distcp" % r for r in range(4)])
        F._use_metadata_class("new")
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            md = pickle.load(f)  # the fixture's own classes
        ranks = {info.relative_path for key, info in md.storage_data.items()
                 if key.fqn == "decoder.layers.mlp.linear_fc1.weight" and key.offset[0] == 3}
        self.assertEqual(ranks, {"__2_0.distcp", "__3_0.distcp"})
        doc = self.inspect_json(save)
        self.assertIn("4 layers unstacked", doc["description"])
        self.assertIn("4 ranks (__0_0 .. __3_0.distcp)", doc["description"])
        out = self.p("out")
        self.ok("consolidate", save, out, "--no-progress")
        got = R.read_folder(out)
        self.assertEqual(sorted(got), sorted(per_layer))
        for name, want in per_layer.items():
            self.assertTensorEqual(tensor_from_st(got[name]), want, name)

    def test_consolidate_to_torch_carries_common_state_and_objects(self):
        for common in ("object", "file"):
            with self.subTest(common=common):
                save = self.p("save-" + common)
                per_layer, values, common_state = M.write_torch_dist(save, common=common)
                out = self.p("out-" + common)
                self.ok("consolidate", save, out, "--format", "torch", "--no-progress")
                got = self.load_torch_output(out)
                key = "common_state" if common == "object" else "common"
                self.assertDeepEqual(got[key], common_state, key)
                for fqn, value in values.items():
                    if fqn != "common_state":
                        self.assertDeepEqual(got[fqn], value, fqn)
                for name, want in per_layer.items():
                    self.assertTensorEqual(got[name], want, name)
                if common == "file":
                    self.assertIn(", common.pt;", self.inspect_json(save)["description"])

    def test_consolidate_to_dcp_and_reshard_to_new_world_size(self):
        save, per_layer, values, common_state = self.write(tp=2, num_layers=2)
        out = self.p("dcp")
        self.ok("consolidate", save, out, "--format", "torch-dcp", "--no-progress")
        md, loaded = O.read_dcp(out)
        for name, want in per_layer.items():
            self.assertTensorEqual(loaded[name], want, name)
        # A dict value is flattened as torch flattens every dict; planner_data nests it again.
        self.assertIn("common_state.optimizer.param_groups.0.lr", loaded)
        self.assertDeepEqual(O.unflatten(md, loaded)["common_state"], common_state)
        # Row-parallel split into 4 ranks of per-layer tensors.
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [
                {"pattern": "linear_(qkv|fc1)\\.(weight|bias)$", "split_dim": 0},
                {"pattern": "linear_(proj|fc2)\\.weight$", "split_dim": 1},
                {"pattern": "(word_embeddings|output_layer)\\.weight$", "split_dim": 0},
                {"pattern": ".*", "replicate": True}]}, f)
        out4 = self.p("dcp4")
        self.ok("reshard", save, out4, "--parts", 4, "--rules", rules, "--format", "torch-dcp",
                "--no-progress")
        md4, loaded4 = O.read_dcp(out4)
        self.assertEqual(sorted(n for n in os.listdir(out4) if n.endswith(".distcp")),
                         ["__%d_0.distcp" % r for r in range(4)])
        for name, want in per_layer.items():
            self.assertTensorEqual(loaded4[name], want, name)
        self.assertEqual(len(md4.state_dict_metadata[
            "decoder.layers.1.self_attention.linear_qkv.weight"].chunks), 4)

    def test_tag_picks_the_iteration(self):
        save, per_layer, _, _ = self.write()
        os.rename(M.iteration_folder(save), os.path.join(save, "iter_0000020"))
        res = self.ctl("inspect", save)
        self.assertExit(res, 3)
        self.assertIn("iter_0000010", res.text)
        doc = self.inspect_json(save, "--tag", "iter_0000020")
        self.assertEqual(len(doc["tensors"]), len(per_layer))
        self.assertIn("iter_0000020", doc["description"])


class TorchDistRefusalTests(Base):

    def expect_rejected(self, src, words):
        out = self.p("out-rejected")
        res = self.ctl("consolidate", src, out, "--no-progress")
        self.assertExit(res, 3)
        for word in words:
            self.assertIn(word, res.text, self.describe(res))
        self.assertFalse(os.path.exists(out), "OUT was created" + self.describe(res))
        self.assertEqual([n for n in os.listdir(self.p()) if "staging" in n], [])
        res = self.ctl("inspect", src, "--json")
        self.assertExit(res, 3)
        self.assertFalse(json.loads(res.stdout_text)["ok"])
        return res

    def test_missing_metadata_json(self):
        save, _, _, _ = self.write()
        os.remove(os.path.join(M.iteration_folder(save), "metadata.json"))
        self.expect_rejected(save, ["metadata.json", "missing", "unfinished"])
        # The iteration folder given directly is still recognized, and refused the same way.
        res = self.expect_rejected(M.iteration_folder(save), ["metadata.json: missing"])
        self.assertIn("Megatron-Core torch_dist", res.text)

    def test_missing_and_truncated_data_file(self):
        save, _, _, _ = self.write()
        path = os.path.join(M.iteration_folder(save), "__1_0.distcp")
        shutil.copy(path, self.p("keep.distcp"))
        os.remove(path)
        self.expect_rejected(save, ["__1_0.distcp", "missing"])
        shutil.copy(self.p("keep.distcp"), path)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        self.expect_rejected(save, ["__1_0.distcp", "truncated"])

    def test_missing_dcp_metadata(self):
        save, _, _, _ = self.write()
        os.remove(os.path.join(M.iteration_folder(save), ".metadata"))
        self.expect_rejected(save, [".metadata", "missing"])

    def test_other_backend_and_garbage_metadata_json(self):
        save, _, _, _ = self.write()
        path = os.path.join(M.iteration_folder(save), "metadata.json")
        with open(path, "w") as f:
            json.dump({"sharded_backend": "zarr", "sharded_backend_version": 1}, f)
        self.expect_rejected(save, ['sharded_backend "zarr"', "torch_dist"])
        with open(path, "w") as f:
            f.write("{not json")
        self.expect_rejected(save, ["metadata.json", "not a JSON object"])

    def test_layer_counts_that_disagree(self):
        save, _, _, _ = self.write()
        folder = M.iteration_folder(save)
        # Claim 3 layers for one stacked tensor, its layer 2 chunk pointing at layer 0's bytes:
        # the DCP checkpoint itself is consistent, the layer axes are not.
        F._use_metadata_class("new")
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            real = pickle.load(f)
        entry = real.state_dict_metadata["decoder.layers.mlp.linear_fc2.bias"]
        entry.size = torch.Size([3] + list(entry.size)[1:])
        chunks = real.state_dict_metadata["decoder.layers.mlp.linear_fc2.bias"].chunks
        chunks.append(F.ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([1, 8])))
        info = next(v for k, v in real.storage_data.items()
                    if k.fqn == "decoder.layers.mlp.linear_fc2.bias")
        real.storage_data[F.MetadataIndex("decoder.layers.mlp.linear_fc2.bias", (2, 0), 2)] = info
        F.write_metadata(folder, real)
        self.expect_rejected(save, ["disagree on the number of layers", "has 3", "has 2"])


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
