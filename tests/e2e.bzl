"""reshard_e2e_test: an end-to-end test of reshardctl (and reshardd), a Python or bash script.

A Python script runs through //tests:run_py.sh (Debian's /usr/bin/python3, no bytecode files):

  python3 SCRIPT --reshardctl PATH [flags of `needs`] [`flags`] [`classes`]

and a bash script (SCRIPT ending in .sh) is the test itself: SCRIPT --reshardctl PATH [flags].

Every test has in its runfiles reshardctl, //tests:e2e_support (harness.py, st_reference.py,
st_torch.py, the checkpoint writers of tests/fixtures) and tools/bench/make_checkpoint.py, and
the tag "e2e" (`bazel test --test_tag_filters=-e2e //...` runs the unit tests alone).

`needs` names what else a test starts, each with its flags, runfiles and tags:
  "reshardd"  --reshardd, and tests/daemon/daemon_harness.py, which starts it
  "probe"     --probe: tests/daemon/grpc_probe, raw gRPC calls
  "radosgw"   --rgw-sh and --flaky-proxy: a real Ceph radosgw (lib/io/s3/testing/rgw.sh) behind
              a proxy that can fail requests, and tests/s3/rgw_fixture.py, which starts both;
              "exclusive", since Ceph needs about 1 GB of RAM while it runs
  "slurm"     no flag: the test starts its own munged, slurmctld and slurmd (as root, on ports
              chosen at run time); "exclusive"

`flags` maps a flag to the label of its file (`"--lying-s3": "//lib/io/s3:testing/lying_s3.py"`);
`classes` restricts the run to these unittest classes; `data` adds other runfiles (modules the
script imports). Timeouts follow `size` ("medium" unless given).
"""

_RESHARDCTL = "//client:reshardctl"

_COMMON_DATA = [
    _RESHARDCTL,
    "//tests:e2e_support",
    "//tools/bench:make_checkpoint.py",
]

_NEEDS = {
    "reshardd": struct(
        flags = {"--reshardd": "//server:reshardd"},
        data = ["//tests/daemon:daemon_harness.py"],
        tags = [],
    ),
    "probe": struct(
        flags = {"--probe": "//tests/daemon:grpc_probe"},
        data = [],
        tags = [],
    ),
    "radosgw": struct(
        flags = {
            "--rgw-sh": "//lib/io/s3:testing/rgw.sh",
            "--flaky-proxy": "//lib/io/s3:testing/flaky_proxy.py",
        },
        data = ["//tests/s3:rgw_fixture.py"],
        tags = ["exclusive"],
    ),
    "slurm": struct(
        flags = {},
        data = [],
        tags = ["exclusive"],
    ),
}

def _unique(items):
    """`items` in their order, each once."""
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out

def _flag_args(flags):
    args = []
    for flag, label in flags.items():
        args += [flag, "$(location %s)" % label]
    return args

def reshard_e2e_test(
        name,
        script,
        classes = [],
        needs = [],
        flags = {},
        data = [],
        size = "medium",
        tags = [],
        **kwargs):
    """An sh_test running `script`; see the file's docstring."""
    for need in needs:
        if need not in _NEEDS:
            fail("%s: unknown need %r (known: %s)" % (name, need, ", ".join(_NEEDS)))
    needed = [_NEEDS[need] for need in needs]

    all_flags = {"--reshardctl": _RESHARDCTL}
    for need in needed:
        all_flags.update(need.flags)
    all_flags.update(flags)
    need_data = [label for need in needed for label in need.data]
    need_tags = [tag for need in needed for tag in need.tags]

    if script.endswith(".sh"):
        if classes:
            fail("%s: classes select unittest classes of a Python script, not of %s" %
                 (name, script))
        srcs = [script]
        args = _flag_args(all_flags)
        script_data = []
    else:
        srcs = ["//tests:run_py.sh"]
        args = ["$(location %s)" % script] + _flag_args(all_flags) + classes
        script_data = [script]

    native.sh_test(
        name = name,
        size = size,
        srcs = srcs,
        args = args,
        data = _unique(script_data + data + _COMMON_DATA + all_flags.values() + need_data),
        tags = _unique(tags + ["e2e"] + need_tags),
        **kwargs
    )
