"""End-to-end tests of reshard's NeMo reader (format nemo) against checkpoints written with real
torch and Python's tarfile (tests/fixtures/nemo_fixture.py).

Run:  /usr/bin/python3 tests/nemo_e2e_test.py --reshardctl PATH [unittest args]

NeMo 1 `.nemo` archives in each weight layout (one model_weights.ckpt, mp_rank_XX per TP rank,
tp_rank_XX_pp_rank_YYY per TP x PP rank, a model_weights/ torch_dist folder) and a NeMo 2 folder
are inspected and consolidated to safetensors; the outputs are read back by tests/st_reference.py
(json, struct, numpy only) and compared element by element with the fixture's numpy arrays (the
torch_dist archive: with the archive extracted by tarfile and read as torch's FileSystemReader
reads it, pickle and torch.load, by tests/fixtures/dcp_fixture.py). Bad archives (truncated, a member
leaving the archive, a missing rank) fail naming the archive and member, and write nothing.
"""

import json
import os
import shutil
import sys
import tarfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import harness  # noqa: E402
import st_reference as R  # noqa: E402
from st_torch import tensor_from_st  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
import dcp_fixture as F  # noqa: E402
import nemo_fixture as N  # noqa: E402
import nemo_io_json_fixture as IO  # noqa: E402
import hf_export_e2e_test as H  # noqa: E402
import hf_megatron_fixture as hmf  # noqa: E402

RESHARDCTL = None

# What inspect adds for a Megatron model with biases (the fixture's), which --format hf reads.
GPT2_NOTE = "; --format hf --family auto: gpt2 (LayerNorm biases or learned position embeddings)"


class NemoTests(harness.CliTestCase):
    TMP_PREFIX = "reshard-nemo"

    def assertSameAsNumpy(self, out, full):
        got = R.read_folder(out)
        self.assertEqual(sorted(got), sorted(full))
        for name, want in full.items():
            self.assertEqual(got[name].dtype, "F32", name)
            self.assertEqual(tuple(got[name].array.shape), tuple(want.shape), name)
            self.assertTrue(np.array_equal(got[name].array, want.numpy()), name)

    def consolidate_and_compare(self, path, full):
        out = self.p("out-" + os.path.basename(path))
        self.ok("consolidate", path, out, "--no-progress")
        self.assertSameAsNumpy(out, full)
        self.assertExit(self.ctl("verify", path, out), 0)

    def test_nemo1_single_ckpt(self):
        for fmt, label in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
            with self.subTest(tar=label):
                path = self.p("single-%s.nemo" % label)
                full = N.write_nemo1(path, fmt=fmt)
                doc = self.inspect_json(path)
                self.assertEqual(doc["format"], "nemo")
                self.assertEqual(
                    doc["description"],
                    "NeMo 1 archive, TP1 x PP1, one model_weights.ckpt, 2 layers; tokenizer and "
                    "other files: tokenizer.model" + GPT2_NOTE)
                self.consolidate_and_compare(path, full)

    def test_nemo1_mp_rank_per_tp_rank(self):
        path = self.p("tp2.nemo")
        full = N.write_nemo1(path, tp=2)
        doc = self.inspect_json(path)
        self.assertEqual(doc["description"],
                         "NeMo 1 archive, TP2 x PP1, model_weights.ckpt per rank, 2 layers; "
                         "tokenizer and other files: tokenizer.model" + GPT2_NOTE)
        self.consolidate_and_compare(path, full)

    def test_nemo1_tp_pp_ranks(self):
        path = self.p("tp2pp2.nemo")
        full = N.write_nemo1(path, tp=2, pp=2, layers=4)
        with tarfile.open(path) as tar:
            self.assertIn("./tp_rank_01_pp_rank_001/model_weights.ckpt", tar.getnames())
        self.assertIn("TP2 x PP2, model_weights.ckpt per rank, 4 layers",
                      self.inspect_json(path)["description"])
        self.consolidate_and_compare(path, full)

    def test_nemo2_folder(self):
        folder = self.p("nemo2")
        full = N.write_nemo2(folder)
        doc = self.inspect_json(folder)
        self.assertEqual(doc["format"], "nemo")
        self.assertTrue(doc["description"].startswith(
            "NeMo 2 folder (context/, weights/), tokenizer files: tokenizer.json; "
            "Megatron-Core torch_dist, weights, 2 layers unstacked"), doc["description"])
        self.consolidate_and_compare(folder, full)

    def assertRefused(self, path, message):
        out = self.p("out-refused")
        res = self.ctl("consolidate", path, out, "--no-progress")
        self.assertExit(res, 3)
        self.assertIn(message, res.stderr_text)
        self.assertFalse(os.path.exists(out))

    def assertTruncatedRefused(self, path, name):
        """`path` cut 100 bytes into member `name`'s data is refused naming member and offsets."""
        with tarfile.open(path) as tar:
            member = tar.getmember(name)
        keep = member.offset_data + 100
        N.truncate(path, keep)
        self.assertRefused(path, "%s: truncated archive: member %s (header at byte offset %d) "
                                 "has %d bytes from byte offset %d but the archive ends at byte "
                                 "offset %d"
                           % (path, name, member.offset, member.size, member.offset_data, keep))

    def test_truncated_archive_names_member_and_offset(self):
        path = self.p("cut.nemo")
        N.write_nemo1(path, tp=2)
        self.assertTruncatedRefused(path, "./mp_rank_01/model_weights.ckpt")

    def test_member_leaving_the_archive_is_refused(self):
        path = self.p("evil.nemo")
        N.write_tar(path, [("./model_config.yaml", b"tensor_model_parallel_size: 1\n"),
                           ("../model_weights.ckpt", b"x")])
        self.assertRefused(path, "%s: header at byte offset 1024: member "
                                 "\"../model_weights.ckpt\" leaves the archive" % path)

    def extracted_model(self, path):
        """The model in `path`'s model_weights/, extracted with tarfile and read by real torch
        (pickle and torch.load of every chunk), the layer-stacked tensors unstacked: name ->
        tensor."""
        folder = self.p("extracted-" + os.path.basename(path))
        with tarfile.open(path) as tar:
            tar.extractall(folder)
        flat = F.read_dcp(os.path.join(folder, "model_weights"))
        model = {}
        for name, value in flat.items():
            if not isinstance(value, torch.Tensor):
                continue
            if name.startswith("model.decoder.layers."):
                rest = name[len("model.decoder.layers."):]
                for layer in range(value.shape[0]):
                    model["model.decoder.layers.%d.%s" % (layer, rest)] = value[layer]
            else:
                model[name] = value
        return model

    def test_nemo1_torch_dist_weights_read_in_place(self):
        path = self.p("dist.nemo")
        N.write_nemo1_dist(path, tp=2)
        doc = self.inspect_json(path)
        self.assertEqual(doc["format"], "nemo")
        self.assertTrue(doc["description"].startswith(
            "NeMo 1 archive, torch_dist weights (model_weights/), TP2 x PP1, 2 layers; tokenizer "
            "and other files: tokenizer.model; Megatron-Core torch_dist, model_weights, 2 layers "
            "unstacked from 10 layer-stacked tensors; PyTorch DCP, 2 ranks"), doc["description"])
        want = self.extracted_model(path)
        self.consolidate_and_compare(path, want)
        out = self.p("out-bf16")
        self.ok("consolidate", path, out, "--no-progress", "--dtype", "bf16")
        got = R.read_folder(out)
        self.assertEqual(sorted(got), sorted(want))
        for name, tensor in want.items():
            self.assertTrue(torch.equal(tensor_from_st(got[name]), tensor.to(torch.bfloat16)),
                            name)

    def test_nemo1_torch_dist_missing_member_is_refused(self):
        path = self.p("dist-missing.nemo")
        N.write_nemo1_dist(path, tp=2, drop="__1_0.distcp")
        root = "tar://%s!/model_weights" % path
        self.assertRefused(path, "%s: NeMo 1 TP2 x PP1 (model_config.yaml): model_weights/: "
                                 "Megatron-Core torch_dist checkpoint %s: %s/.metadata: tensor "
                                 "\"model.embedding.word_embeddings.weight\", chunk 1 [6:12, 0:8]: "
                                 "%s/__1_0.distcp: data file \"__1_0.distcp\" is missing\n"
                           % (path, root, root, root))

    def test_nemo1_torch_dist_truncated_archive_is_refused(self):
        path = self.p("dist-cut.nemo")
        N.write_nemo1_dist(path, tp=2)
        self.assertTruncatedRefused(path, "./model_weights/__1_0.distcp")

    def test_missing_rank_is_refused(self):
        path = self.p("missing.nemo")
        N.write_nemo1(path, tp=2, pp=2, layers=4, skip_rank=(1, 1))
        self.assertRefused(path, "%s: NeMo 1 TP2 x PP2 (model_config.yaml): member "
                                 "tp_rank_01_pp_rank_001/model_weights.ckpt is missing" % path)


class NemoHfTests(H.Base):
    """--format hf from a NeMo 1 archive: the config from model_config.yaml (NeMo's keys are
    Megatron's args), the vocabulary from --vocab-size (NeMo keeps it in the tokenizer)."""

    def export_and_check(self, write, path, seed):
        """Writes the Llama model of `seed` with write(path, spec, hf, tp=2), exports it and
        compares tensors and config.json with the HF state dict it came from."""
        spec = hmf.Spec("llama", groups=2, seed=seed)
        hf = hmf.hf_state_dict(spec)
        write(path, spec, hf, tp=2)
        out = self.p("out")
        self.export(path, out, "--vocab-size", "50")
        self.check_tensors(out, hf)
        self.check_config(out, spec)

    def test_llama_tp2_archive_to_hf(self):
        self.export_and_check(N.write_nemo1_hf, self.p("llama.nemo"), seed=11)

    def test_llama_tp2_torch_dist_archive_to_hf(self):
        self.export_and_check(N.write_nemo1_dist_hf, self.p("llama-dist.nemo"), seed=13)

    def test_nemo2_folder_to_hf(self):
        self.export_and_check(N.write_nemo2_hf, self.p("nemo2"), seed=12)

    def test_nemo2_folder_with_only_io_json_to_hf(self):
        """context/ without model.yaml: the config comes from io.json (fiddle's serialization of
        the TrainerContext), and config.json equals the one model.yaml gives."""
        spec = hmf.Spec("llama", groups=2, seed=14)
        hf = hmf.hf_state_dict(spec)
        outs = {}
        for model_yaml in (True, False):
            folder = self.p("nemo2-%s" % model_yaml)
            N.write_nemo2_hf(folder, spec, hf, tp=2, model_yaml=model_yaml)
            outs[model_yaml] = self.p("out-%s" % model_yaml)
            self.export(folder, outs[model_yaml], "--vocab-size", "50")
        self.assertFalse(os.path.exists(os.path.join(self.p("nemo2-False"), "context",
                                                     "model.yaml")))
        self.check_tensors(outs[False], hf)
        self.check_config(outs[False], spec)
        for name in ("config.json", "generation_config.json"):
            self.assertEqual(self.read_json(outs[False], name), self.read_json(outs[True], name))

    def test_nemo2_malformed_io_json_refuses_hf_alone(self):
        spec = hmf.Spec("llama", groups=2, seed=15)
        hf = hmf.hf_state_dict(spec)
        good = IO.io_json(IO.trainer_context(IO.model_config(
            "nemo.collections.llm.gpt.model.llama", "LlamaConfig", N.nemo2_config_fields(spec))))
        cases = (
            (good.replace('"key": "llama_config_1"', '"key": "llama_config_7"'),
             'context/io.json: objects["llama_model_1"].items[0][1]: a reference to '
             '"llama_config_7", which "objects" lacks'),
            (good[:200], "context/io.json: not valid JSON at byte offset 200 "
                         "([json.exception.parse_error.101] parse error at line 1, column 201: "
                         "syntax error while parsing value - invalid string: missing closing "
                         "quote; last read: '\"tensor_model_parallel_size')"),
        )
        reference = self.p("good")
        N.write_nemo2_hf(reference, spec, hf, tp=2, model_yaml=False, io_json=good)
        self.ok("consolidate", reference, self.p("out-good"), "--no-progress")
        want = R.read_folder(self.p("out-good"))
        for i, (text, message) in enumerate(cases):
            with self.subTest(case=i):
                folder = self.p("bad-%d" % i)
                N.write_nemo2_hf(folder, spec, hf, tp=2, model_yaml=False, io_json=text)
                self.refused(folder, self.p("out-bad"), ["--vocab-size", "50"],
                             os.path.join(folder, message))
                # Only --format hf needs the config: the weights consolidate as from a good
                # folder, and inspect gives the refusal as its hf: line.
                out = self.p("out-%d" % i)
                self.ok("consolidate", folder, out, "--no-progress")
                got = R.read_folder(out)
                self.assertEqual(sorted(got), sorted(want))
                for name, tensor in want.items():
                    self.assertEqual(got[name].dtype, tensor.dtype, name)
                    self.assertTrue(np.array_equal(got[name].array, tensor.array), name)
                self.assertEqual(self.inspect_json(folder)["hf_export"], {
                    "family": None,
                    "note": "does not export to Hugging Face as llama (--format hf) as it "
                            "stands: " + os.path.join(folder, message)})

    def assertCarried(self, out, carried):
        """OUT holds each of `carried` (HF name -> bytes) byte for byte."""
        for name, data in carried.items():
            with open(os.path.join(out, name), "rb") as f:
                self.assertEqual(f.read(), data, name)

    def archive_to_hf(self, layout, tp, pp, legacy, seed, tokenizer, extra_yaml="",
                      rope_scaling=None, special=None):
        """A Llama GQA model written as a .nemo (`layout`, its tokenizer as members), exported
        without --vocab-size: the tensors against the HF state dict it came from (cut to the
        tokenizer's vocabulary), config.json field by field. Returns OUT."""
        spec = hmf.Spec("llama", layers=4, groups=2, seed=seed)
        hf = hmf.hf_state_dict(spec)
        path = self.p("llama-%s.nemo" % layout)
        N.write_nemo1_llama(path, spec, hf, tp, pp, layout=layout, legacy=legacy,
                            tokenizer=tokenizer, extra_yaml=extra_yaml)
        out = self.p("out-%s" % layout)
        self.export(path, out)
        self.check_tensors(out, hf)
        self.check_config(out, spec, rope_scaling=rope_scaling, special=special)
        return out

    def test_sentencepiece_tokenizer_carried_and_vocab_trimmed_each_layout(self):
        # The model's 50 tokens (padded to 64 rows); trainer_spec without ids: bos 1, eos 2.
        blob = N.sentencepiece_blob(50)
        cases = (("single", 1, 1, True), ("ranks", 2, 2, False), ("ranks", 2, 1, True),
                 ("dist", 2, 1, False))
        for seed, (layout, tp, pp, legacy) in enumerate(cases, 40):
            with self.subTest(layout=layout, tp=tp, pp=pp, legacy=legacy):
                out = self.archive_to_hf(layout, tp, pp, legacy, seed,
                                         {"model": ("tokenizer.model", blob)},
                                         special={"bos_token_id": 1, "eos_token_id": 2})
                self.assertCarried(out, {"tokenizer.model": blob})
                shutil.rmtree(out)

    def test_sentencepiece_special_ids_from_the_archive_member(self):
        # Gemma-like ids: none of SentencePiece's defaults.
        blob = N.sentencepiece_blob(50, bos=5, eos=7, pad=3)
        out = self.archive_to_hf("ranks", 2, 1, False, 45, {"model": ("tokenizer.model", blob)},
                                 special={"bos_token_id": 5, "eos_token_id": 7,
                                          "pad_token_id": 3})
        self.assertCarried(out, {"tokenizer.model": blob})

    def test_broken_tokenizer_model_is_refused_naming_the_member(self):
        spec = hmf.Spec("llama", groups=2, seed=46)
        hf = hmf.hf_state_dict(spec)
        blob = N.sentencepiece_blob(50, damage="group")
        path = self.p("broken.nemo")
        N.write_nemo1_llama(path, spec, hf, 2, tokenizer={"model": ("tokenizer.model", blob)})
        self.refused(path, self.p("out"), ["--vocab-size", "50"],
                     "%s: arranging the hf output: reading the special token ids of the tokenizer "
                     "carried into the output: %s: member %s_tokenizer.model: not a "
                     "SentencePiece model (ModelProto): wire type 3 of field 1 (no group or "
                     "other type is in sentencepiece_model.proto) at byte offset %d"
                     % (path, path, N.TOKENIZER_HASH, len(blob) - 1))

    def test_bpe_vocab_and_merges_carried_rope_scaling(self):
        vocab = json.dumps({"t%d" % i: i for i in range(50)}).encode()
        merges = b"#version: 0.2\nt 1\n"
        out = self.archive_to_hf(
            "ranks", 2, 1, False, 50,
            {"vocab_file": ("gpt2-vocab.json", vocab), "merge_file": ("gpt2-merges.txt", merges)},
            extra_yaml="scale_positional_embedding: true\n",
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
        self.assertCarried(out, {"vocab.json": vocab, "merges.txt": merges})
        self.assertEqual(sorted(os.listdir(out)),
                         ["config.json", "generation_config.json", "merges.txt",
                          "model.safetensors", "reshard-manifest.json", "vocab.json"])

    def test_tokenizer_entry_outside_or_missing_is_refused(self):
        spec = hmf.Spec("llama", groups=2, seed=51)
        hf = hmf.hf_state_dict(spec)
        cases = (
            ("nemo:../x",
             ': model_config.yaml: tokenizer.model "nemo:../x" names no member at the '
             "archive's root: a tokenizer file NeMo registers is a member beside "
             "model_config.yaml, never outside the archive"),
            ("nemo:%s_tokenizer.model" % N.TOKENIZER_HASH,
             ': model_config.yaml: tokenizer.model "nemo:{0}_tokenizer.model": the archive has '
             "no member {0}_tokenizer.model (an incomplete archive)".format(N.TOKENIZER_HASH)),
        )
        for i, (entry, message) in enumerate(cases):
            with self.subTest(entry=entry):
                path = self.p("bad-%d.nemo" % i)
                N.write_nemo1_llama(path, spec, hf, 2, tokenizer={"model": entry})
                self.refused(path, self.p("out-bad"), [], path + message)

    def test_activation_other_than_swiglu_is_refused(self):
        spec = hmf.Spec("llama", groups=2, seed=53)
        hf = hmf.hf_state_dict(spec)
        path = self.p("gelu.nemo")
        N.write_nemo1_llama(path, spec, hf, 2, activation="gelu",
                            tokenizer={"model": ("tokenizer.model", N.sentencepiece_blob(50))})
        self.refused(path, self.p("out"), [],
                     "%s: arranging the hf output: the checkpoint's MLP is not SwiGLU "
                     "(args.swiglu is false; activation is gelu), but family llama's is "
                     "(hidden_act \"silu\"): --format hf writes no model of this activation"
                     % path)

    def test_nemo2_tokenizer_folder_carried_and_vocab_trimmed(self):
        # With io.json alone, the config's vocab_size is null (GPTConfig's default): the
        # tokenizer's size is the vocabulary all the same.
        spec = hmf.Spec("llama", groups=2, seed=52)
        hf = hmf.hf_state_dict(spec)
        for model_yaml in (True, False):
            with self.subTest(model_yaml=model_yaml):
                folder = self.p("nemo2-%s" % model_yaml)
                N.write_nemo2_hf(folder, spec, hf, tp=2, model_yaml=model_yaml)
                blob = N.sentencepiece_blob(50, bos=3, eos=4)
                config = b'{"tokenizer_class": "LlamaTokenizer"}'
                tokenizer = os.path.join(folder, "context", "nemo_tokenizer")
                for name, data in (("tokenizer.model", blob), ("tokenizer_config.json", config)):
                    with open(os.path.join(tokenizer, name), "wb") as f:
                        f.write(data)
                out = self.p("out-%s" % model_yaml)
                self.export(folder, out)
                self.check_tensors(out, hf)
                # No tokenizer.json: the ids are tokenizer.model's.
                self.check_config(out, spec, special={"bos_token_id": 3, "eos_token_id": 4})
                self.assertCarried(out, {"tokenizer.model": blob,
                                         "tokenizer_config.json": config})


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl"))
