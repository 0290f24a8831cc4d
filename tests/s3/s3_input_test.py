#!/usr/bin/python3
"""reshardctl with s3:// inputs (safetensors) against a real Ceph radosgw.

The module starts radosgw (lib/io/s3/testing/rgw.sh, ports chosen at run time, cluster under a
short /tmp/rgw.XXXXXX) and testing/flaky_proxy.py in front of it, uploads checkpoints written
by tools/bench/make_checkpoint.py with boto3, and checks that reading them from S3 gives the
same bytes as reading the local copies: a Hugging Face sharded folder and a DeepSpeed ZeRO-3
save (fp32 and bf16, each within the 64 MiB cap less a margin), a single file, a folder without
an index, through the flaky proxy (retries).
It also checks inspect, plan and verify on s3:// paths (verify of an s3:// consolidation against
its s3:// input within the same bound), and the errors: wrong secret, missing
key and bucket, malformed URL, no credentials, a layout reshard does not read from S3. Then
torch.save inputs written by Debian's torch (/usr/bin/python3): a single file and a sharded
pytorch_model-*.bin folder with its index, consolidated in fp32 and bf16 byte-equal to the local
copies, inspect and verify, the range GETs their metadata costs (counted by a second proxy that
fails nothing), and damaged objects (a flipped byte in a storage record: its CRC-32; a cut
central directory) refused naming the object. Finally it runs the S3Store gtest binary
(lib/io/s3/s3_store_rgw_test.cc) against the same radosgw.

Training layouts (DeepSpeed ZeRO-2/3, PyTorch DCP, Megatron-Core torch_dist, Megatron-LM
TP x PP, ColossalAI, verl FSDP, FSDP1, OLMo-sharded, a NeMo 1 archive of per-rank weights,
DeepSpeed MoE with ZeRO-2), written by the repository's fixture writers, are consolidated from
S3 byte-equal to their local copies and inspected, with their metadata's range GETs counted; an
element-strided (column-major) DCP layout is converted byte-equal too, each byte fetched once;
damaged objects are refused naming them.

Usage: s3_input_test.py --reshardctl PATH --rgw-sh PATH --flaky-proxy PATH --make-checkpoint PATH
                        --store-test PATH [unittest args]
(tests/fixtures/*_fixture.py and tools/bench/make_colossalai_checkpoint.py are found beside
this file and beside make_checkpoint.py.)
"""

import contextlib
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import rgw_fixture  # noqa: E402

BUCKET = "models"
# The fixture writers of tests/fixtures.
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
# Peak RSS allowed for a consolidation of the 256 MiB models read from S3, and for a verify of
# two s3:// sides (2 x 1 MiB windows and 4 x 8 MiB spans besides the process): the 64 MiB cap of
# every conversion (kOutputMemoryCap, lib/engine/conversion.h) less a 2 MiB margin. It holds a
# safetensors read's window and spans, which ShareConversionMemory sizes from that cap, and the
# process itself.
MAX_RSS = 62 << 20

# Filled by setUpModule.
ENV = {}
STATE = {}


def s3_client():
    return STATE["rgw"].boto3()


def upload_folder(s3, folder, prefix, skip=()):
    for name in sorted(os.listdir(folder)):
        if name not in skip:
            s3.upload_file(os.path.join(folder, name), BUCKET, "%s/%s" % (prefix, name))


def make_checkpoint(out, size, max_shard, dtype_seed=0):
    subprocess.run(["/usr/bin/python3", harness.BINARIES["make-checkpoint"], out, "--size", size,
                    "--max-shard-size", max_shard, "--block-size", "8MiB", "--seed",
                    str(dtype_seed), "--quiet"], check=True, stdout=subprocess.DEVNULL)


# Writes DIR/single/model.pt (torch.save of a state dict: 24 layers of fp32 weights, biases
# and norms, an int64 step) and DIR/sharded (the same tensors in 3 pytorch_model-*.bin shards and
# pytorch_model.bin.index.json), as transformers' save_pretrained lays them out.
MAKE_TORCH = r"""
import collections, json, os, sys, torch
out = sys.argv[1]
torch.manual_seed(0)
sd = collections.OrderedDict()
sd["embed.weight"] = torch.randn(512, 256)
for i in range(24):
    sd["layers.%d.attn.weight" % i] = torch.randn(256, 256)
    sd["layers.%d.attn.bias" % i] = torch.randn(256)
    sd["layers.%d.norm.weight" % i] = torch.randn(256)
    sd["layers.%d.mlp.weight" % i] = torch.randn(512, 256)
sd["head.weight"] = torch.randn(512, 256)
sd["step"] = torch.tensor([7, 8], dtype=torch.int64)
os.makedirs(os.path.join(out, "single"))
torch.save(sd, os.path.join(out, "single", "model.pt"))
os.makedirs(os.path.join(out, "sharded"))
names = list(sd)
shards = [names[:35], names[35:70], names[70:]]
weight_map = {}
for n, keys in enumerate(shards):
    file = "pytorch_model-%05d-of-%05d.bin" % (n + 1, len(shards))
    torch.save(collections.OrderedDict((k, sd[k]) for k in keys),
               os.path.join(out, "sharded", file))
    weight_map.update({k: file for k in keys})
total = sum(t.numel() * t.element_size() for t in sd.values())
with open(os.path.join(out, "sharded", "pytorch_model.bin.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
"""


# Writes, under DIR, a small checkpoint of every training layout reshard reads from S3, with the
# repository's fixture writers (tests/fixtures, tools/bench): zero3/ (DeepSpeed ZeRO-3, 4 ranks,
# a save folder with `latest`), zero2/ (ZeRO-2, 2 ranks), dcp/ (PyTorch DCP, 4 ranks, row and
# column chunks, a BYTE_IO value), dcp-colmajor/ (chunks stored transposed: element-strided,
# one tensor of 8 MiB),
# torchdist/ (Megatron-Core torch_dist, TP2 x PP2, layer-stacked), megatron/ (Megatron-LM
# TP2 x PP2 save folder).
MAKE_LAYOUTS = r"""
import os, sys
out, fixtures, bench = sys.argv[1:4]
sys.path[:0] = [fixtures, bench]
import torch
import dcp_fixture as D
import megatron_fixture as MF
import torch_dist_fixture as T
import zero_fixture as Z
Z.write_benchmark_checkpoint(os.path.join(out, "zero3"), 6 << 20, stage=3, world_size=4,
                             num_params=24)
Z.write_benchmark_checkpoint(os.path.join(out, "zero2"), 2 << 20, stage=2, world_size=2,
                             num_params=12)
torch.manual_seed(0)
sd = {"model": {"embed.weight": torch.randn(1000, 256), "layers.0.w": torch.randn(512, 256),
                "layers.0.b": torch.randn(512), "layers.1.w": torch.randn(256, 512)},
      "step": 7}
D.write_dcp(os.path.join(out, "dcp"), sd, 4,
            {"model.embed.weight": D.Row(4), "model.layers.0.w": D.Row(2),
             "model.layers.1.w": D.Col(4)})
# layers.2.w's four column-major chunks (2 MiB each) exceed the 4 MiB of local copies a filler
# keeps in memory: two of them are gathered from scratch files.
sd_colmajor = {"model": dict(sd["model"], **{"layers.2.w": torch.randn(1024, 2048)}), "step": 7}
D.write_dcp(os.path.join(out, "dcp-colmajor"), sd_colmajor, 4,
            {"model.layers.1.w": D.Col(4, column_major=True),
             "model.layers.2.w": D.Col(4, column_major=True)})
T.write_torch_dist(os.path.join(out, "torchdist"), tp=2, pp=2, num_layers=4, hidden=64, ffn=128,
                   vocab=100)
MF.write_megatron_lm(os.path.join(out, "megatron"), MF.GPT(train_tp=2, seed=1), tp=2, pp=2)
"""

# Writes, under DIR, a small save of the trainers' per-rank layout NAME with the writers of its
# end-to-end test or tests/fixtures, one layout a process (their stand-ins for torch 2.x classes
# replace torch modules' classes): verl/ (verl FSDP, 4 ranks), fsdp1/ (FSDP1 sharded state dict,
# 3 ranks), olmo-sharded/ (OLMo LocalShardedCheckpointer, 2 ranks), nemo1/model.nemo (NeMo 1, a
# model_weights.ckpt per rank of TP2 x PP2), moe-zero/ (DeepSpeed MoE, 8 experts at EP 2 on 4
# ranks, ZeRO-2).
MAKE_RANK_LAYOUT = r"""
import os, sys
out, tests, name = sys.argv[1:4]
sys.path[:0] = [tests, os.path.join(tests, "fixtures")]
folder = os.path.join(out, name)
if name == "verl":
    import verl_e2e_test as V
    V.write_verl(folder, V.verl_model(0), 4)
elif name == "fsdp1":
    import fsdp1_e2e_test as F
    F.write_fsdp1(folder, F.fsdp1_model(0), 3)
elif name == "olmo-sharded":
    import olmo_sharded_e2e_test as O
    O.write_olmo_sharded(folder, O.olmo_model(0), 2)
elif name == "nemo1":
    import nemo_fixture as N
    os.makedirs(folder)
    N.write_nemo1(os.path.join(folder, "model.nemo"), tp=2, pp=2)
elif name == "moe-zero":
    import deepspeed_moe_fixture as M
    M.write_zero(folder, M.Model(), ep=2, world=4)
"""
RANK_LAYOUTS = ["verl", "fsdp1", "olmo-sharded", "nemo1", "moe-zero"]

# The training layouts of MAKE_LAYOUTS, MAKE_RANK_LAYOUT, the ColossalAI and the OLMo one,
# uploaded under layouts/: path under layouts/ -> the format inspect must find.
LAYOUTS = {"zero3": "deepspeed-zero", "zero2": "deepspeed-zero", "dcp": "torch-dcp",
           "torchdist": "megatron-torch-dist", "megatron": "megatron",
           "colossalai": "colossalai-dist", "olmo": "olmo-safetensors",
           "verl": "verl-fsdp", "fsdp1": "fsdp1-sharded", "olmo-sharded": "olmo-sharded",
           "nemo1/model.nemo": "nemo", "moe-zero": "deepspeed-zero"}


def upload_tree(s3, folder, prefix):
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(root, name)
            s3.upload_file(path, BUCKET, "%s/%s" % (prefix, os.path.relpath(path, folder)))


def STATE_TORCH_FLIP(torch_dir):
    """The byte in the middle of the largest storage record of single/model.pt."""
    import struct
    import zipfile
    path = os.path.join(torch_dir, "single", "model.pt")
    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    STATE["torch_flipped_entry"] = info.filename
    return info.header_offset + 30 + name_length + extra_length + info.file_size // 2


def setUpModule():
    # 503 SlowDown for every 10th request, every 13th dropped without an answer: about one in six
    # fails, each retried (6 attempts), so a run through it fails only by a bug.
    rgw = rgw_fixture.Radosgw(harness.BINARIES["rgw-sh"], harness.BINARIES["flaky-proxy"],
                              fail_every=10, drop_every=13)
    STATE["rgw"] = rgw
    rgw.start()
    base = rgw.base
    endpoint = rgw.endpoint
    STATE["base"] = base
    STATE["proxy_endpoint"] = rgw.proxy_endpoint
    STATE["endpoint"] = endpoint
    ENV.update(rgw.env())
    # No ~/.aws/credentials of the machine's user.
    ENV["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(base, "no-credentials")

    local = os.path.join(base, "local")
    os.makedirs(local)
    STATE["local"] = local
    s3 = s3_client()
    s3.create_bucket(Bucket=BUCKET)
    # A 256 MiB Hugging Face sharded folder (5 shards and the index).
    big = os.path.join(local, "big")
    make_checkpoint(big, "256MiB", "64MiB")
    upload_folder(s3, big, "big")
    # A 256 MiB DeepSpeed ZeRO-3 save of 8 ranks: every parameter gathered from a run per rank.
    subprocess.run(["/usr/bin/python3", "-c",
                    "import sys; sys.path.insert(0, sys.argv[1]); import zero_fixture as Z; "
                    "Z.write_benchmark_checkpoint(sys.argv[2], 256 << 20, stage=3, world_size=8)",
                    FIXTURES, os.path.join(local, "zero3big")], check=True,
                   stdout=subprocess.DEVNULL)
    upload_tree(s3, os.path.join(local, "zero3big"), "zero3big")
    # An 8 MiB one in 3 shards: the single file, the folder without index, the proxy runs.
    small = os.path.join(local, "small")
    make_checkpoint(small, "8MiB", "3MiB", 1)
    upload_folder(s3, small, "small")
    upload_folder(s3, small, "noindex", skip=("model.safetensors.index.json",))
    single = os.path.join(local, "single")
    subprocess.run([harness.BINARIES["reshardctl"], "consolidate", small, single, "--no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    s3.upload_file(os.path.join(single, "model.safetensors"), BUCKET, "single/model.safetensors")
    # torch.save checkpoints (Debian's torch), their damaged copies, and a DeepSpeed layout.
    torch_dir = os.path.join(local, "torch")
    subprocess.run(["/usr/bin/python3", "-c", MAKE_TORCH, torch_dir], check=True)
    s3.upload_file(os.path.join(torch_dir, "single", "model.pt"), BUCKET, "torch1/model.pt")
    upload_folder(s3, os.path.join(torch_dir, "sharded"), "torchsharded")
    with open(os.path.join(torch_dir, "single", "model.pt"), "rb") as f:
        model_pt = f.read()
    flipped = bytearray(model_pt)
    flipped[STATE_TORCH_FLIP(torch_dir)] ^= 0x10
    s3.put_object(Bucket=BUCKET, Key="torchbad/flipped.pt", Body=bytes(flipped))
    s3.put_object(Bucket=BUCKET, Key="torchbad/cut.pt", Body=model_pt[:-200])
    # A DeepSpeed layout whose model states file is a plain state dict: not DeepSpeed's.
    s3.put_object(Bucket=BUCKET, Key="deepspeed/latest", Body=b"global_step1")
    s3.put_object(Bucket=BUCKET, Key="deepspeed/global_step1/mp_rank_00_model_states.pt",
                  Body=model_pt)
    # Training layouts (DeepSpeed ZeRO, DCP, torch_dist, Megatron-LM, ColossalAI).
    layouts = os.path.join(local, "layouts")
    bench = os.path.dirname(harness.BINARIES["make-checkpoint"])
    subprocess.run(["/usr/bin/python3", "-c", MAKE_LAYOUTS, layouts, FIXTURES, bench], check=True,
                   stdout=subprocess.DEVNULL)
    for name in RANK_LAYOUTS:
        subprocess.run(["/usr/bin/python3", "-c", MAKE_RANK_LAYOUT, layouts,
                        os.path.dirname(FIXTURES), name], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["/usr/bin/python3", os.path.join(bench, "make_colossalai_checkpoint.py"),
                    os.path.join(layouts, "colossalai"), "--size", "6MiB", "--tp", "2",
                    "--block-size", "1MiB", "--quiet"], check=True, stdout=subprocess.DEVNULL)
    # OLMo safetensors (encoded key names): read as such from s3://, not as plain safetensors.
    subprocess.run([harness.BINARIES["reshardctl"], "consolidate", small,
                    os.path.join(layouts, "olmo"), "--format", "olmo-safetensors",
                    "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    for name in sorted(os.listdir(layouts)):
        upload_tree(s3, os.path.join(layouts, name), "layouts/" + name)
    # A shard the index names is missing.
    upload_folder(s3, small, "broken", skip=("model-00002-of-00003.safetensors",))


def tearDownModule():
    if "rgw" in STATE:
        STATE["rgw"].stop()


class S3InputTests(harness.TempDirTestCase):
    TIMEOUT = 120

    def ctl(self, *args, env=None):
        cmd = [harness.BINARIES["reshardctl"]] + [str(a) for a in args]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=self.TIMEOUT, env=env or ENV)
        res.text = (res.stdout + res.stderr).decode("utf-8", "replace")
        res.cmd = cmd
        return res

    def ok(self, *args, env=None):
        res = self.ctl(*args, env=env)
        self.assertEqual(res.returncode, 0, "%s\n%s" % (" ".join(res.cmd), res.text[-3000:]))
        return res

    def fails(self, code, *args, env=None):
        res = self.ctl(*args, env=env)
        self.assertGreaterEqual(res.returncode, 0, "crashed: %s\n%s" % (res.cmd, res.text))
        self.assertEqual(res.returncode, code, "%s\n%s" % (" ".join(res.cmd), res.text[-3000:]))
        return res.text

    def assertSameFolder(self, a, b):
        for name in ("model.safetensors", "model.safetensors.index.json"):
            if os.path.exists(os.path.join(b, name)) or os.path.exists(os.path.join(a, name)):
                self.assertTrue(filecmp.cmp(os.path.join(a, name), os.path.join(b, name),
                                            shallow=False), name)
        data = sorted(n for n in os.listdir(b) if n.endswith(".safetensors"))
        self.assertEqual(sorted(n for n in os.listdir(a) if n.endswith(".safetensors")), data)
        for name in data:
            self.assertTrue(filecmp.cmp(os.path.join(a, name), os.path.join(b, name),
                                        shallow=False), name)

    @contextlib.contextmanager
    def counting_proxy(self):
        """Yields count(*args): runs reshardctl ARGS through a proxy that fails nothing and
        returns the (range GETs, requests) it forwarded for them."""
        port = STATE["endpoint"].rsplit(":", 1)[1]
        stats = self.p("count.stats")
        proxy = subprocess.Popen(["/usr/bin/python3", harness.BINARIES["flaky-proxy"], port,
                                  self.p("count.port"), stats, "1000000000", "1000000000"])
        try:
            for _ in range(100):
                if os.path.exists(self.p("count.port")):
                    break
                time.sleep(0.05)
            with open(self.p("count.port")) as f:
                env = dict(ENV, AWS_ENDPOINT_URL="http://127.0.0.1:%s" % f.read())
            # Requests 1 and 2 fail (n % N == 1, 2): spend them on a HEAD of nothing.
            self.ctl("inspect", "s3://%s/nothing" % BUCKET, env=env)
            self.ctl("inspect", "s3://%s/nothing" % BUCKET, env=env)

            def count(*args):
                with open(stats) as f:
                    before = json.load(f)
                self.ok(*args, env=env)
                with open(stats) as f:
                    after = json.load(f)
                # The bytes the range GETs asked for, for callers that bound them.
                count.range_bytes = (after["forwarded_range_bytes"] -
                                     before["forwarded_range_bytes"])
                return (after["forwarded_range_gets"] - before["forwarded_range_gets"],
                        after["forwarded"] - before["forwarded"])
            yield count
        finally:
            proxy.kill()
            proxy.wait()

    def consolidate_both(self, url, local, *args):
        """Consolidates `url` and its local copy `local`; the outputs must be byte-equal."""
        remote_out, local_out = self.p("from-s3"), self.p("from-local")
        self.ok("consolidate", url, remote_out, "--no-progress", *args)
        self.ok("consolidate", local, local_out, "--no-progress", *args)
        self.assertSameFolder(remote_out, local_out)
        return remote_out

    def ok_in_bounded_memory(self, what, *args):
        """Runs reshardctl ARGS against the store, which must succeed within MAX_RSS."""
        cmd = [harness.BINARIES["reshardctl"]] + [str(a) for a in args]
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(ENV)
        try:
            start = time.time()
            code, out, err, rss = harness.run_peak_rss(cmd, self.TIMEOUT)
            seconds = time.time() - start
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertEqual(code, 0, (out + err).decode("utf-8", "replace")[-3000:])
        sys.stderr.write("%s: 256 MiB in %.2f s, peak RSS %.1f MiB\n" % (
            what, seconds, rss / 2**20))
        self.assertLess(rss, MAX_RSS, "%s: peak RSS %.1f MiB" % (what, rss / 2**20))
        return out

    def consolidate_in_bounded_memory(self, name, local):
        """Consolidates s3://BUCKET/NAME in fp32 and bf16, each within MAX_RSS and byte-equal to
        the consolidation of its local copy `local`."""
        for dtype in ("f32", "bf16"):
            remote_out, local_out = self.p("s3-" + dtype), self.p("local-" + dtype)
            self.ok_in_bounded_memory("s3 -> local %s %s" % (name, dtype), "consolidate",
                                      "s3://%s/%s" % (BUCKET, name), remote_out, "--no-progress",
                                      "--dtype", dtype)
            self.ok("consolidate", local, local_out, "--no-progress", "--dtype", dtype)
            self.assertSameFolder(remote_out, local_out)

    def test_sharded_folder_fp32_and_bf16_byte_equal_in_bounded_memory(self):
        self.consolidate_in_bounded_memory("big", os.path.join(STATE["local"], "big"))
        # The manifest names the s3:// source.
        with open(os.path.join(self.p("s3-f32"), "reshard-manifest.json")) as f:
            self.assertEqual(json.load(f)["source"]["path"], "s3://%s/big" % BUCKET)

    def test_zero3_gather_fp32_and_bf16_byte_equal_in_bounded_memory(self):
        # Each window gathers one run per rank per parameter (RemoteRunQueue); bf16 converts
        # through the queue's scratch memory.
        self.consolidate_in_bounded_memory("zero3big", os.path.join(STATE["local"], "zero3big"))

    def test_verify_s3_output_against_s3_input_in_bounded_memory(self):
        # Both sides read from S3, each through its own spans: the windows and spans of both
        # come from the budget a conversion shares (ShareConversionMemory).
        url, out = "s3://%s/big" % BUCKET, "s3://%s/verify-big" % BUCKET
        self.ok("consolidate", url, out, "--no-progress")
        try:
            stdout = self.ok_in_bounded_memory("verify s3 vs s3", "verify", url, out)
            self.assertTrue(stdout.decode().startswith("equal: 138 tensors"), stdout)
        finally:
            s3 = s3_client()
            for key in s3.list_objects_v2(Bucket=BUCKET, Prefix="verify-big/").get(
                    "Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=key["Key"])

    def test_sharded_output_and_trailing_slash(self):
        self.consolidate_both("s3://%s/small/" % BUCKET, os.path.join(STATE["local"], "small"),
                              "--max-shard-size", "2MiB")

    def test_partitioned_consolidation(self):
        # Two workers write a share each; the second to finish publishes OUT. `commit` re-plans
        # from the request's input, which stays the s3:// URL.
        out = self.p("partitioned")
        for i in range(2):
            self.ok("consolidate", "s3://%s/small" % BUCKET, out, "--max-shard-size", "2MiB",
                    "--partition", "%d/2" % i, "--no-progress")
        self.ok("commit", out)
        local_out = self.p("local")
        self.ok("consolidate", os.path.join(STATE["local"], "small"), local_out,
                "--max-shard-size", "2MiB", "--no-progress")
        self.assertSameFolder(out, local_out)

    def test_single_file(self):
        self.consolidate_both("s3://%s/single/model.safetensors" % BUCKET,
                              os.path.join(STATE["local"], "single", "model.safetensors"),
                              "--dtype", "bf16")

    def test_folder_without_index(self):
        out = self.consolidate_both("s3://%s/noindex" % BUCKET,
                                    os.path.join(STATE["local"], "small"))
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))

    def test_reshard_and_merge_parts(self):
        # Split into 2 parts (rows and columns), then merge parts read from S3: the chunks of a
        # column-split tensor take turns between the part files.
        rules = self.p("rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [
                {"pattern": "(q|k|v|gate|up)_proj\\.weight$", "split_dim": 0},
                {"pattern": "(o|down)_proj\\.weight$", "split_dim": 1},
                {"pattern": ".*", "replicate": True}]}, f)
        parts = self.p("parts")
        self.ok("reshard", "s3://%s/small" % BUCKET, parts, "--parts", "2", "--rules", rules,
                "--no-progress")
        local_parts = self.p("local-parts")
        self.ok("reshard", os.path.join(STATE["local"], "small"), local_parts, "--parts", "2",
                "--rules", rules, "--no-progress")
        self.assertSameFolder(parts, local_parts)
        s3 = s3_client()
        upload_folder(s3, parts, "parts-%d" % os.getpid(), skip=("reshard-manifest.json",))
        self.consolidate_both("s3://%s/parts-%d" % (BUCKET, os.getpid()), parts, "--rules", rules)

    def test_through_flaky_proxy_same_bytes(self):
        env = dict(ENV, AWS_ENDPOINT_URL=STATE["proxy_endpoint"])
        stats = os.path.join(STATE["base"], "proxy.stats")
        with open(stats) as f:
            before = json.load(f)
        remote_out, local_out = self.p("via-proxy"), self.p("local")
        self.ok("consolidate", "s3://%s/small" % BUCKET, remote_out, "--no-progress", env=env)
        self.ok("consolidate", os.path.join(STATE["local"], "small"), local_out, "--no-progress")
        self.assertSameFolder(remote_out, local_out)
        with open(stats) as f:
            after = json.load(f)
        # Requests went through the proxy, and some failed and were retried.
        self.assertGreater(after["forwarded"], before["forwarded"])
        self.assertGreater(after["failed_503"] + after["dropped"],
                           before["failed_503"] + before["dropped"])

    def test_inspect_plan_verify(self):
        url = "s3://%s/big" % BUCKET
        doc = json.loads(self.ok("inspect", url, "--json").stdout)
        self.assertEqual(doc["format"], "safetensors")
        self.assertEqual(doc["tensor_count"], 138)
        self.assertIn(url, self.ok("inspect", url).stdout.decode())
        plan = json.loads(self.ok("plan", url, "--dtype", "bf16", "--json").stdout)
        self.assertTrue(plan["ok"], plan)
        local = os.path.join(STATE["local"], "big")
        self.assertEqual(self.ctl("verify", url, local).returncode, 0)
        # A bf16 copy compares equal (rounded), a changed tensor does not.
        self.ok("consolidate", local, self.p("bf16"), "--dtype", "bf16", "--no-progress")
        self.ok("verify", url, self.p("bf16"))
        small = os.path.join(STATE["local"], "small")
        self.fails(4, "verify", "s3://%s/small" % BUCKET, os.path.join(STATE["local"], "big"))
        self.ok("verify", "s3://%s/small" % BUCKET, "s3://%s/noindex" % BUCKET)
        self.ok("verify", "s3://%s/single/model.safetensors" % BUCKET, small)

    def test_wrong_secret(self):
        env = dict(ENV, AWS_SECRET_ACCESS_KEY="not-the-secret")
        text = self.fails(3, "inspect", "s3://%s/big" % BUCKET, env=env)
        self.assertIn("SignatureDoesNotMatch", text)
        text = self.fails(3, "consolidate", "s3://%s/big" % BUCKET, self.p("o"), env=env)
        self.assertIn("SignatureDoesNotMatch", text)
        self.assertFalse(os.path.exists(self.p("o", "model.safetensors")))

    def test_missing_key_bucket_and_malformed_url(self):
        text = self.fails(3, "consolidate", "s3://%s/nothing/model.safetensors" % BUCKET,
                          self.p("o"))
        self.assertIn("nothing/model.safetensors", text)
        self.assertIn("does not exist", text)
        text = self.fails(3, "inspect", "s3://reshard-no-such-bucket/model")
        self.assertIn("NoSuchBucket", text)
        text = self.fails(3, "inspect", "s3://Not_A_Bucket/model")
        self.assertIn("Not_A_Bucket", text)
        # A shard the index lists is missing.
        text = self.fails(3, "inspect", "s3://%s/broken" % BUCKET)
        self.assertIn("model-00002-of-00003.safetensors", text)

    def test_no_credentials(self):
        env = {k: v for k, v in ENV.items() if k not in (
            "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE")}
        env["HOME"] = self.tmp
        text = self.fails(3, "inspect", "s3://%s/big" % BUCKET, env=env)
        self.assertIn("AWS_ACCESS_KEY_ID", text)
        self.assertIn("s3://%s/big" % BUCKET, text)

    def test_not_deepspeed_model_states_refused_naming_the_object(self):
        url = "s3://%s/deepspeed/global_step1/mp_rank_00_model_states.pt" % BUCKET
        res = self.ctl("inspect", "s3://%s/deepspeed" % BUCKET, "--json")
        self.assertEqual(res.returncode, 3, res.text)
        self.assertIn(url, res.text)
        text = self.fails(3, "consolidate", "s3://%s/deepspeed/global_step1" % BUCKET,
                          self.p("o"))
        self.assertIn(url, text)
        self.assertFalse(os.path.exists(self.p("o")))

    def test_training_layouts_consolidate_byte_equal_and_inspect(self):
        for name, fmt in sorted(LAYOUTS.items()):
            with self.subTest(layout=name):
                url = "s3://%s/layouts/%s" % (BUCKET, name)
                local = os.path.join(STATE["local"], "layouts", name)
                doc = json.loads(self.ok("inspect", url, "--json").stdout)
                local_doc = json.loads(self.ok("inspect", local, "--json").stdout)
                self.assertEqual(doc["format"], fmt)
                self.assertEqual(doc["tensor_count"], local_doc["tensor_count"])
                self.assertGreater(doc["tensor_count"], 0)
                self.consolidate_both(url, local, "--max-shard-size", "4MiB")
                shutil.rmtree(self.p("from-s3"))
                shutil.rmtree(self.p("from-local"))
        # bf16 output and verify, s3 against local, on one of them.
        url = "s3://%s/layouts/zero3" % BUCKET
        self.consolidate_both(url, os.path.join(STATE["local"], "layouts", "zero3"),
                              "--dtype", "bf16")
        self.ok("verify", url, os.path.join(STATE["local"], "layouts", "zero3"))

    def test_training_layout_metadata_requests(self):
        # The range GETs and requests in all of `inspect` (metadata only) per layout, counted
        # by a proxy that fails nothing.
        with self.counting_proxy() as count:
            counts = {name: count("inspect", "s3://%s/layouts/%s" % (BUCKET, name), "--json")
                      for name in sorted(LAYOUTS)}
        for name, (gets, requests) in sorted(counts.items()):
            local = os.path.join(STATE["local"], "layouts", name)
            files = 1 if os.path.isfile(local) else sum(len(f) for _, _, f in os.walk(local))
            sys.stderr.write("%s (%d files) metadata: %d range GETs, %d requests in all\n" % (
                name, files, gets, requests))
            # A few range GETs per file, whatever the tensor count.
            self.assertLessEqual(gets, 4 * files, name)

    def test_element_strided_layout_byte_equal_and_verified(self):
        # DCP chunks stored transposed (column-major): their elements are strided in the objects.
        # Each chunk is fetched once into a local copy (in memory, or an unlinked scratch file
        # in $TMPDIR beyond 4 MiB) and gathered as from a local file: the same bytes as the
        # conversion of the local copy, F32 and BF16, and verify passes against it.
        url = "s3://%s/layouts/dcp-colmajor" % BUCKET
        local = os.path.join(STATE["local"], "layouts", "dcp-colmajor")
        size = sum(os.path.getsize(os.path.join(root, name))
                   for root, _, names in os.walk(local) for name in names)
        scratch = self.p("scratch")
        os.makedirs(scratch)
        old_tmpdir = ENV.get("TMPDIR")
        ENV["TMPDIR"] = scratch  # the counting proxy's commands run with it
        try:
            with self.counting_proxy() as count:
                count("inspect", url)
                metadata = count.range_bytes
                for dtype in ("f32", "bf16"):
                    remote_out, local_out = self.p("s3-" + dtype), self.p("local-" + dtype)
                    gets, _ = count("consolidate", url, remote_out, "--no-progress", "--dtype",
                                    dtype)
                    self.ok("consolidate", local, local_out, "--no-progress", "--dtype", dtype)
                    self.assertSameFolder(remote_out, local_out)
                    # No byte of the objects read twice for the strided chunks: beyond the
                    # metadata `inspect` reads, the range GETs ask for at most the objects'
                    # bytes and the spans' small overlaps.
                    data = count.range_bytes - metadata
                    sys.stderr.write("dcp-colmajor %s: %d range GETs, %d bytes (%d of them "
                                     "metadata), objects %d bytes\n" % (
                                         dtype, gets, count.range_bytes, metadata, size))
                    self.assertLessEqual(data, size + size // 50, dtype)
                    # The scratch files had no name.
                    self.assertEqual(os.listdir(scratch), [])
        finally:
            if old_tmpdir is None:
                del ENV["TMPDIR"]
            else:
                ENV["TMPDIR"] = old_tmpdir
        self.ok("verify", url, local)
        # Without a folder for the scratch files the tensor that needs them fails, naming
        # itself, the object and the folder, before its output file is complete.
        missing = self.p("missing")
        text = self.fails(3, "consolidate", url, self.p("o"), "--no-progress",
                          env=dict(ENV, TMPDIR=missing))
        self.assertIn("model.layers.2.w", text)
        self.assertIn("s3://%s/layouts/dcp-colmajor/" % BUCKET, text)
        self.assertIn(missing, text)
        self.assertFalse(os.path.exists(self.p("o", "model.safetensors")))

    def test_damaged_training_layouts_refused_naming_the_object(self):
        s3 = s3_client()
        local = os.path.join(STATE["local"], "layouts")
        # A ZeRO-3 rank's optimizer file cut short: its zip end records are gone.
        folder = os.path.join(local, "zero3", "global_step1000")
        name = sorted(n for n in os.listdir(folder) if n.endswith("_optim_states.pt"))[1]
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        upload_tree(s3, os.path.join(local, "zero3"), "bad-zero3")
        s3.put_object(Bucket=BUCKET, Key="bad-zero3/global_step1000/" + name, Body=data[:-100])
        text = self.fails(3, "inspect", "s3://%s/bad-zero3" % BUCKET)
        self.assertIn("s3://%s/bad-zero3/global_step1000/%s" % (BUCKET, name), text)
        self.assertIn("byte offset", text)
        # A DCP data file cut inside its last chunk: named with the chunk's offset.
        dcp = os.path.join(local, "dcp")
        data_file = sorted(n for n in os.listdir(dcp) if n.endswith(".distcp"))[0]
        with open(os.path.join(dcp, data_file), "rb") as f:
            data = f.read()
        upload_tree(s3, dcp, "bad-dcp")
        s3.put_object(Bucket=BUCKET, Key="bad-dcp/" + data_file, Body=data[:-100])
        text = self.fails(3, "inspect", "s3://%s/bad-dcp" % BUCKET)
        self.assertIn("s3://%s/bad-dcp/%s" % (BUCKET, data_file), text)
        self.assertIn("truncated", text)

    def test_torch_single_file_fp32_and_bf16(self):
        local = os.path.join(STATE["local"], "torch", "single", "model.pt")
        for dtype in ("f32", "bf16"):
            with self.subTest(dtype=dtype):
                out = self.consolidate_both("s3://%s/torch1/model.pt" % BUCKET, local,
                                            "--dtype", dtype)
                self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))
                shutil.rmtree(out)
                shutil.rmtree(self.p("from-local"))

    def test_torch_sharded_folder_fp32_and_bf16(self):
        local = os.path.join(STATE["local"], "torch", "sharded")
        for dtype in ("f32", "bf16"):
            with self.subTest(dtype=dtype):
                self.consolidate_both("s3://%s/torchsharded" % BUCKET, local, "--dtype", dtype,
                                      "--max-shard-size", "8MiB")
                shutil.rmtree(self.p("from-s3"))
                shutil.rmtree(self.p("from-local"))

    def test_torch_inspect_verify_and_metadata_requests(self):
        url = "s3://%s/torchsharded" % BUCKET
        doc = json.loads(self.ok("inspect", url, "--json").stdout)
        self.assertEqual(doc["format"], "torch")
        self.assertEqual(doc["tensor_count"], 99)
        local_doc = json.loads(self.ok("inspect", os.path.join(STATE["local"], "torch", "sharded"),
                                       "--json").stdout)
        self.assertEqual(doc["tensor_count"], local_doc["tensor_count"])
        self.ok("verify", url, os.path.join(STATE["local"], "torch", "single", "model.pt"))
        self.ok("verify", url, "s3://%s/torch1/model.pt" % BUCKET)
        self.fails(4, "verify", url, os.path.join(STATE["local"], "big"))
        # The range GETs of the metadata, counted by a proxy that fails nothing: the index, per
        # shard the tail (end records and central directory), then the local headers with
        # data.pkl in windows of at most 1 MiB; the headers of a layer lie within 258 KiB, the
        # next layer's more than 512 KiB further (the 512 KiB mlp record): about one window
        # per layer (8-9 per shard), never one GET per tensor (99).
        with self.counting_proxy() as count:
            gets, requests = count("inspect", url, "--json")
        sys.stderr.write("torch sharded folder (3 shards, 99 tensors) metadata: %d range GETs, "
                         "%d requests in all\n" % (gets, requests))
        self.assertLessEqual(gets, 1 + 3 * (1 + 10))

    def test_torch_damaged_objects_refused_naming_them(self):
        url = "s3://%s/torchbad/flipped.pt" % BUCKET
        text = self.fails(3, "consolidate", url, self.p("o"), "--no-progress")
        self.assertIn(url, text)
        self.assertIn("CRC-32", text)
        self.assertIn(STATE["torch_flipped_entry"], text)
        self.assertFalse(os.path.exists(self.p("o", "model.safetensors")))
        url = "s3://%s/torchbad/cut.pt" % BUCKET
        text = self.fails(3, "inspect", url)
        self.assertIn(url, text)
        self.assertIn("zip archive", text)
        self.assertIn("byte offset", text)

    def test_store_gtest(self):
        env = dict(ENV, S3_TEST_ENDPOINT=STATE["endpoint"])
        res = subprocess.run([harness.BINARIES["store-test"]], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=self.TIMEOUT)
        self.assertEqual(res.returncode, 0, res.stdout.decode("utf-8", "replace")[-5000:])


if __name__ == "__main__":
    sys.exit(harness.main(globals(), "reshardctl", "rgw-sh", "flaky-proxy", "make-checkpoint",
                          "store-test"))
