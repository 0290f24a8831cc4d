"""End-to-end tests of `reshardctl consolidate IN OUT --format hf` from training saves of a model
under its Hugging Face names (lib/formats/hf/hf_named.h): HF Trainer + DeepSpeed ZeRO-2 and
ZeRO-3 checkpoints (`output_dir/checkpoint-N/` with config.json, generation_config.json, the
tokenizer and `global_stepN/`) and an HF Trainer / accelerate FSDP save through DCP
(`checkpoint-N/pytorch_model_fsdp_0/`, every name under accelerate's `model.` key).

Run:  /usr/bin/python3 tests/hf_from_trainer_e2e_test.py --reshardctl PATH [unittest args]

The saves are written with real torch by the repository's writers (tests/fixtures/zero_fixture.py,
tests/fixtures/dcp_fixture.py) from a known Llama state dict (hf_megatron_fixture.hf_state_dict);
the output's safetensors files are parsed by the independent numpy reader (st_reference.py) and
every tensor compared element by element with that state dict. The files beside the weights are
compared byte for byte with the ones the checkpoint folder holds.
"""

import collections
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_fixture  # noqa: E402
import hf_megatron_fixture as hmf  # noqa: E402
import st_reference  # noqa: E402
import zero_fixture  # noqa: E402

STEP = 500
TOKENIZER_FILES = {
    "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {"<s>": 1, "</s>": 2}}},
    "tokenizer_config.json": {"bos_token": "<s>", "eos_token": "</s>"},
    "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>"},
}


def llama_config(spec, **overrides):
    """config.json as LlamaConfig.save_pretrained writes it for `spec`."""
    config = collections.OrderedDict([
        ("architectures", ["LlamaForCausalLM"]), ("model_type", "llama"),
        ("hidden_size", spec.hidden), ("intermediate_size", spec.ffn),
        ("num_hidden_layers", spec.layers), ("num_attention_heads", spec.heads),
        ("num_key_value_heads", spec.groups), ("head_dim", spec.head_dim),
        ("hidden_act", "silu"), ("max_position_embeddings", 128), ("rms_norm_eps", 1e-06),
        ("rope_theta", 500000.0),
        ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}),  # kept as it is
        ("vocab_size", spec.vocab), ("tie_word_embeddings", spec.tied),
        ("bos_token_id", 1), ("eos_token_id", 2), ("torch_dtype", "float32"),
        ("use_cache", True), ("transformers_version", "4.46.0"),
    ])
    config.update(overrides)
    return config


class Base(harness.CliTestCase):
    TMP_PREFIX = "reshard-hf-trainer"
    TIMEOUT = 60

    def write_json(self, path, value):
        with open(path, "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")

    def trainer_folder(self, spec, config=True, step=STEP):
        """`output_dir/checkpoint-<step>/` as HF Trainer leaves it beside the weights' folder:
        config.json, generation_config.json, tokenizer files, trainer_state.json."""
        folder = self.p("output_dir", "checkpoint-%d" % step)
        os.makedirs(folder)
        if config:
            self.write_json(os.path.join(folder, "config.json"), llama_config(spec))
        self.write_json(os.path.join(folder, "generation_config.json"),
                        {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
                         "transformers_version": "4.46.0"})
        for name, value in TOKENIZER_FILES.items():
            self.write_json(os.path.join(folder, name), value)
        self.write_json(os.path.join(folder, "trainer_state.json"), {"global_step": step})
        return folder

    def zero_save(self, spec, stage, world, config=True, extra=None):
        """An HF Trainer + DeepSpeed ZeRO-`stage` checkpoint of a Llama model: the known state
        dict (numpy) and the checkpoint-N folder holding `latest` and global_stepN/."""
        hf = hmf.hf_state_dict(spec)
        if extra:
            hf.update(extra)
        folder = self.trainer_folder(spec, config)
        weights = collections.OrderedDict(
            (k, torch.from_numpy(v)) for k, v in hf.items() if v.ndim == 2)
        norms = collections.OrderedDict(
            (k, torch.from_numpy(v)) for k, v in hf.items() if v.ndim != 2)
        order = list(hf)
        shared = collections.OrderedDict()
        if spec.tied:
            shared["lm_head.weight"] = "model.embed_tokens.weight"
            order.append("lm_head.weight")
        model = zero_fixture.ZeroModel([weights, norms], shared=shared, module_order=order)
        zero_fixture.write_zero_checkpoint(folder, model, stage, world,
                                           tag="global_step%d" % STEP)
        return hf, folder

    def export(self, folder, out, *args):
        res = self.ctl("consolidate", folder, out, "--format", "hf", "--no-progress", *args)
        self.assertExit(res, 0)
        return res

    def refused(self, folder, out, args, code, message):
        """Exit `code`, the message holds `message`, and OUT is not created."""
        self.assertRefusedWithoutOutput(
            ["consolidate", folder, out, "--format", "hf", "--no-progress"] + list(args), out,
            code, message)

    def read_output(self, out):
        """Every tensor of OUT (st_reference Tensors), through the index when sharded."""
        index = os.path.join(out, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            weight_map = None
            files = ["model.safetensors"]
        tensors = {}
        for name in files:
            for key, value in st_reference.read_file(os.path.join(out, name)).items():
                self.assertNotIn(key, tensors, "%s in two files" % key)
                if weight_map is not None:
                    self.assertEqual(weight_map[key], name, key)
                tensors[key] = value
        return tensors

    def check_tensors(self, out, hf, bf16=False):
        got = self.read_output(out)
        self.assertEqual(sorted(got), sorted(hf), "tensor names")
        for name, want in hf.items():
            self.assertEqual(got[name].shape, want.shape, name)
            if bf16:
                self.assertEqual(got[name].dtype, "BF16", name)
                want = torch.from_numpy(want).to(torch.bfloat16).view(torch.int16).numpy()
                have = got[name].array.view(np.int16)
            else:
                self.assertEqual(got[name].dtype, "F32", name)
                have = got[name].array
            np.testing.assert_array_equal(have, want, err_msg=name)

    def check_files(self, folder, out, config_changes=None):
        """The tokenizer files and generation_config.json byte for byte; config.json equal to
        the checkpoint's but for `config_changes`."""
        for name in list(TOKENIZER_FILES) + ["generation_config.json"]:
            with open(os.path.join(folder, name), "rb") as a, \
                    open(os.path.join(out, name), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)
        self.assertFalse(os.path.exists(os.path.join(out, "trainer_state.json")))
        with open(os.path.join(folder, "config.json")) as f:
            want = json.load(f, object_pairs_hook=collections.OrderedDict)
        with open(os.path.join(out, "config.json")) as f:
            got = json.load(f, object_pairs_hook=collections.OrderedDict)
        want.update(config_changes or {})
        self.assertEqual(list(got.items()), list(want.items()))
        if not config_changes:
            with open(os.path.join(folder, "config.json"), "rb") as a, \
                    open(os.path.join(out, "config.json"), "rb") as b:
                self.assertEqual(a.read(), b.read(), "config.json")


class HfFromTrainerTests(Base):
    def test_zero2_trainer_checkpoint_folder(self):
        spec = hmf.Spec("llama", groups=2)
        hf, folder = self.zero_save(spec, stage=2, world=2)
        out = self.p("out")
        self.export(folder, out, "--max-shard-size", "8KB")
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors.index.json")))
        self.check_tensors(out, hf)
        self.check_files(folder, out)

    def test_zero3_global_step_folder_bf16_tied(self):
        # IN is global_stepN/: config.json and the tokenizer come from checkpoint-N/ above it.
        spec = hmf.Spec("llama", groups=1, tied=True)
        hf, folder = self.zero_save(spec, stage=3, world=3)
        out = self.p("out")
        self.export(os.path.join(folder, "global_step%d" % STEP), out, "--dtype", "bf16")
        self.check_tensors(out, hf, bf16=True)
        self.check_files(folder, out, {"torch_dtype": "bfloat16"})

    def test_dcp_fsdp_save_under_accelerate_model_key(self):
        spec = hmf.Spec("llama", groups=2)
        hf = hmf.hf_state_dict(spec)
        folder = self.trainer_folder(spec)
        state = {"model": collections.OrderedDict((k, torch.from_numpy(v)) for k, v in hf.items())}
        shards = {"model." + k: dcp_fixture.Row(2) for k, v in hf.items() if v.ndim == 2}
        dcp_fixture.write_dcp(os.path.join(folder, "pytorch_model_fsdp_0"), state, 2, shards)
        out = self.p("out")
        self.export(os.path.join(folder, "pytorch_model_fsdp_0"), out)
        self.check_tensors(out, hf)
        self.check_files(folder, out)
        # inspect names the family and the wrapper prefix.
        doc = self.inspect_json(os.path.join(folder, "pytorch_model_fsdp_0"))
        self.assertEqual(doc["hf_export"]["family"], "llama", doc["hf_export"])
        self.assertEqual(
            doc["hf_export"]["note"],
            "exports to Hugging Face as llama (--format hf): Hugging Face llama model "
            "(config.json: %s; wrapper prefix \"model.\" stripped)"
            % os.path.join(folder, "config.json"))

    def test_no_extra_files_keeps_config_and_generation_config(self):
        spec = hmf.Spec("llama", groups=2)
        hf, folder = self.zero_save(spec, stage=1, world=2)
        out = self.p("out")
        self.export(folder, out, "--no-extra-files")
        self.check_tensors(out, hf)
        self.assertEqual(sorted(os.listdir(out)),
                         ["config.json", "generation_config.json", "model.safetensors",
                          "reshard-manifest.json"])

    def test_inspect_says_it_exports_and_the_family(self):
        spec = hmf.Spec("llama", groups=2)
        _, folder = self.zero_save(spec, stage=2, world=2)
        doc = self.inspect_json(folder)
        self.assertEqual(doc["hf_export"]["family"], "llama", doc["hf_export"])
        self.assertEqual(doc["hf_export"]["note"],
                         "exports to Hugging Face as llama (--format hf): Hugging Face llama "
                         "model (config.json: %s)" % os.path.join(folder, "config.json"))
        res = self.ok("inspect", folder)
        self.assertIn("hf:       exports to Hugging Face as llama (--format hf)",
                      res.stdout_text)


class HfFromTrainerRefusalTests(Base):
    def test_tensor_the_family_lacks(self):
        spec = hmf.Spec("llama", groups=2)
        extra = {"model.layers.0.mlp.extra_proj.weight": np.ones((3, 16), np.float32)}
        _, folder = self.zero_save(spec, stage=2, world=2, extra=extra)
        self.refused(folder, self.p("out"), [], 3,
                     "tensor \"model.layers.0.mlp.extra_proj.weight\" is not a parameter of a "
                     "llama model (%s)" % os.path.join(folder, "config.json"))

    def test_shape_disagreeing_with_config(self):
        spec = hmf.Spec("llama", groups=2)
        _, folder = self.zero_save(spec, stage=2, world=2)
        self.write_json(os.path.join(folder, "config.json"), llama_config(spec, hidden_size=32))
        self.refused(folder, self.p("out"), [], 3,
                     "tensor \"model.embed_tokens.weight\" has shape [50, 16], but %s makes it "
                     "[50, 32]" % os.path.join(folder, "config.json"))

    def test_no_config_then_config_flag(self):
        spec = hmf.Spec("llama", groups=2)
        hf, folder = self.zero_save(spec, stage=3, world=2, config=False)
        out = self.p("out")
        self.refused(folder, out, [], 3,
                     "no config.json beside the training save (looked in %s): --format hf "
                     "writes a model under Hugging Face names with its config.json; give "
                     "--config FILE" % folder)
        config = self.p("config.json")
        self.write_json(config, llama_config(spec))
        self.export(folder, out, "--config", config, "--dtype", "bf16")
        self.check_tensors(out, hf, bf16=True)
        with open(os.path.join(out, "config.json")) as f:
            got = json.load(f, object_pairs_hook=collections.OrderedDict)
        self.assertEqual(list(got.items()),
                         list(llama_config(spec, torch_dtype="bfloat16").items()))

    def test_config_above_the_trainer_folder_is_not_read(self):
        # output_dir/config.json is outside checkpoint-N/, the folder the weights' folder is in.
        spec = hmf.Spec("llama", groups=2)
        _, folder = self.zero_save(spec, stage=2, world=2, config=False)
        self.write_json(self.p("output_dir", "config.json"), llama_config(spec))
        step = os.path.join(folder, "global_step%d" % STEP)
        self.refused(step, self.p("out"), [], 3,
                     "no config.json beside the training save (looked in %s and %s)"
                     % (step, folder))

    def test_symlink_out_of_the_checkpoint_folder(self):
        spec = hmf.Spec("llama", groups=2)
        _, folder = self.zero_save(spec, stage=2, world=2)
        outside = self.p("elsewhere.json")
        self.write_json(outside, TOKENIZER_FILES["tokenizer.json"])
        os.remove(os.path.join(folder, "tokenizer.json"))
        os.symlink(outside, os.path.join(folder, "tokenizer.json"))
        self.refused(folder, self.p("out"), [], 3,
                     "%s is a symlink to %s, outside the folder %s; reshard does not follow a "
                     "model file's symlink out of its folder"
                     % (os.path.join(folder, "tokenizer.json"), outside,
                        os.path.realpath(folder)))


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
