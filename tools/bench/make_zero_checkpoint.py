#!/usr/bin/python3
"""Write a synthetic DeepSpeed ZeRO checkpoint of a requested size, laid out as DeepSpeed saves it.

Run with /usr/bin/python3 (Debian's python3-torch). Example:

    /usr/bin/python3 tools/bench/make_zero_checkpoint.py --size 4GiB --ranks 8 OUT_DIR

OUT_DIR becomes a DeepSpeed save folder: `latest` naming `global_step1000/`, which holds one
`zero_pp_rank_R_mp_rank_00_model_states.pt` and one `bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt`
per rank (ZeRO-3; `mp_rank_00_model_states.pt` for --stage 1/2), written by
tests/fixtures/zero_fixture.py (the layout the e2e tests check against zero_to_fp32's algorithm).
The fp32 parameters total SIZE bytes (64 params of odd numel, so partitions start mid-row);
--with-moments adds Adam's exp_avg and exp_avg_sq (3x the bytes on disk; reshard reads none of
them). Generation holds the full model in memory (about SIZE plus one rank's share). Prints a
JSON summary on stdout.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
import make_checkpoint as mc  # noqa: E402
import zero_fixture  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output save folder; must not exist")
    ap.add_argument("--size", type=mc.parse_size, default=mc.parse_size("4GiB"),
                    help="fp32 parameter bytes, e.g. 4GiB, 256MiB (default 4GiB)")
    ap.add_argument("--ranks", type=int, default=8, help="data-parallel world size (default 8)")
    ap.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    ap.add_argument("--params", type=int, default=64, help="number of parameters (default 64)")
    ap.add_argument("--with-moments", action="store_true", help="also write Adam moments")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="only the JSON summary")
    args = ap.parse_args()
    if os.path.exists(args.out):
        ap.error("%s exists" % args.out)
    ck = zero_fixture.write_benchmark_checkpoint(
        args.out, args.size, stage=args.stage, world_size=args.ranks, num_params=args.params,
        with_moments=args.with_moments, seed=args.seed)
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(args.out) for f in fs]
    summary = {
        "total_size": sum(t.numel() * t.element_size() for t in ck.expected.values()),
        "files": len(files),
        "tensors": len(ck.expected),
        "stage": args.stage,
        "ranks": args.ranks,
        "bytes_on_disk": sum(os.path.getsize(f) for f in files),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
