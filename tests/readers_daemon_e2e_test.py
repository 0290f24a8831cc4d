"""The trainers' layouts read through a real reshardd and the Python client: a `.nemo` in each of
its three weight layouts (one model_weights.ckpt, mp_rank_XX per TP rank, a model_weights/
torch_dist folder; and --format hf with its tokenizer member), verl FSDP
(actor/model_world_size_W_rank_r.pt), FSDP1 SHARDED_STATE_DICT, OLMo's sharded checkpoint and
Megatron mixture-of-experts in the legacy per-rank layout (TP 2 x EP 2).

Run:  bazel test //tests:e2e_readers_daemon_test, or by hand (from the repository root):

    bazel build //clients/python:reshard_client //server:reshardd //client:reshardctl
    PYTHONPATH=bazel-bin/clients/python /usr/bin/python3 tests/readers_daemon_e2e_test.py \
        --reshardd bazel-bin/server/reshardd --reshardctl bazel-bin/client/reshardctl

One daemon on an ephemeral loopback port (tests/daemon/daemon_harness.py). Each checkpoint is
written with real torch by the writers the per-format suites use, consolidated by a daemon job
submitted with reshard_client.Client and, in-process, by `reshardctl consolidate`; the two
outputs are compared tensor by tensor (tests/st_reference.py: json, struct, numpy) and each with
the writer's own torch or numpy reference of the whole model.
"""

import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))


def _runfiles_path(rel):
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, "reshard", rel)
    return os.path.join(HERE, "..", rel)


sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
sys.path.insert(0, _runfiles_path("clients/python"))
sys.path.insert(0, os.path.dirname(_runfiles_path("tests/daemon/daemon_harness.py")))
import daemon_harness as dh  # noqa: E402
from daemon_harness import DaemonTestCase  # noqa: E402
import st_reference as R  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402  -- a missing torch is a failure, not a skip
from reshard_client import Client  # noqa: E402

import hf_megatron_fixture as hmf  # noqa: E402
import megatron_moe_fixture as moe  # noqa: E402
import nemo_fixture as N  # noqa: E402
import olmo_sharded_e2e_test as OL  # noqa: E402
import verl_e2e_test as V  # noqa: E402
# Last: its stand-in ShardedTensor classes replace torch's in modules the imports above load.
import fsdp1_e2e_test as FS  # noqa: E402


def hf_reference(hf):
    """The HF state dict of hf_megatron_fixture (numpy) as st_reference tensors."""
    return {name: R.Tensor("F32", np.ascontiguousarray(a)) for name, a in hf.items()}


def torch_reference(tensors):
    return {name: V.reference(t) for name, t in tensors.items()}


class ReadersThroughDaemonTests(DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = Client(cls.daemon.addr)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        super().tearDownClass()

    def both(self, src, name, **options):
        """Consolidates `src` as a daemon job (the Python client) and in-process (reshardctl);
        returns both output folders."""
        by_daemon = self.r("daemon-" + name)
        job = self.client.wait(self.client.consolidate(src, by_daemon, **options), timeout=120)
        self.assertEqual(job.state, "SUCCEEDED", job)
        self.assertEqual(job.output, os.path.realpath(by_daemon))
        by_ctl = self.r("ctl-" + name)
        flags = ["--format", options["output_format"]] if "output_format" in options else []
        res = dh.run_ctl(["consolidate", src, by_ctl, "--no-progress"] + flags, json_out=False)
        self.assertEqual(res.rc, 0, repr(res))
        return by_daemon, by_ctl

    def assertSameModel(self, src, name, want, **options):
        """Daemon output == in-process output == `want` (name -> st_reference tensor), tensor by
        tensor, bit for bit. Returns both output folders."""
        by_daemon, by_ctl = self.both(src, name, **options)
        from_daemon, from_ctl = R.read_folder(by_daemon), R.read_folder(by_ctl)
        self.assertEqual(sorted(from_daemon), sorted(want), "%s: daemon's tensor names" % name)
        self.assertEqual(sorted(from_ctl), sorted(want), "%s: reshardctl's tensor names" % name)
        for tensor, expected in want.items():
            for who, got in (("daemon", from_daemon), ("reshardctl", from_ctl)):
                diff = R.diff_tensors(expected, got[tensor], nan_any=False)
                self.assertIsNone(diff, "%s, %s: %s: %s" % (name, who, tensor, diff))
        return by_daemon, by_ctl

    def test_nemo1_each_weight_layout(self):
        cases = (("single", lambda p: N.write_nemo1(p)),
                 ("mp-rank", lambda p: N.write_nemo1(p, tp=2)),
                 ("tp-pp-rank", lambda p: N.write_nemo1(p, tp=2, pp=2, layers=4)),
                 ("torch-dist", lambda p: self.nemo_dist(p)))
        for name, write in cases:
            with self.subTest(layout=name):
                path = self.r("%s.nemo" % name)
                full = write(path)
                self.assertSameModel(path, name, torch_reference(full))

    def nemo_dist(self, path):
        """The torch_dist archive's model as torch reads it (per layer, `model.` names)."""
        stacked = N.write_nemo1_dist(path, tp=2)
        model = {}
        for name, value in stacked.items():
            if isinstance(value, torch.Tensor):
                model[name] = value
        return model

    def test_nemo1_to_hugging_face_with_its_tokenizer(self):
        spec = hmf.Spec("llama", layers=2, groups=2, seed=61)
        hf = hmf.hf_state_dict(spec)
        blob = N.sentencepiece_blob(spec.vocab)
        path = self.r("llama.nemo")
        N.write_nemo1_llama(path, spec, hf, 2, tokenizer={"model": ("tokenizer.model", blob)})
        outs = self.assertSameModel(path, "hf", hf_reference(hf), output_format="hf")
        for out in outs:
            with open(os.path.join(out, "tokenizer.model"), "rb") as f:
                self.assertEqual(f.read(), blob, out)
            with open(os.path.join(out, "config.json"), "rb") as f:
                config = f.read()
            with open(os.path.join(outs[0], "config.json"), "rb") as f:
                self.assertEqual(f.read(), config, out)

    def test_verl_fsdp_world_size_4(self):
        sd = V.verl_model(62)
        src = V.write_verl(self.r("verl", "actor"), sd, 4)
        self.assertSameModel(src, "verl", torch_reference(sd))

    def test_fsdp1_sharded_state_dict_3_ranks(self):
        sd = FS.fsdp1_model(63)
        src = self.r("fsdp1")
        FS.write_fsdp1(src, sd, 3)
        self.assertSameModel(src, "fsdp1", torch_reference(sd))

    def test_olmo_sharded_3_ranks(self):
        sd = OL.olmo_model(64)
        src = OL.write_olmo_sharded(self.r("olmo", "step10"), sd, 3)
        self.assertSameModel(src, "olmo", torch_reference(sd))

    def test_megatron_moe_legacy_tp2_ep2(self):
        model = moe.MoE(train_tp=2, seed=65)
        save = self.r("moe")
        moe.write(save, model, tp=2, pp=1, ep=2)
        self.assertSameModel(save, "moe", torch_reference(moe.expected(model)))


if __name__ == "__main__":
    dh.main()
