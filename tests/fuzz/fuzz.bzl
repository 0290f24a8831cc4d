"""reshard_fuzzer: a libFuzzer target beside the code it fuzzes.

With `--config=fuzz` (.bazelrc: clang, -fsanitize=fuzzer,address,undefined) the binary is a
libFuzzer executable that tests/fuzz/run_fuzzers.sh runs on its seed corpus. In the normal build
it links //tests/fuzz:replay_main instead, so every build compiles it against the same
libraries as the code it fuzzes, and it replays the files it is given.
"""

def reshard_fuzzer(name, srcs, deps = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//tests/fuzz:fuzzing": [],
            "//conditions:default": ["//tests/fuzz:replay_main"],
        }),
        linkopts = select({
            "//tests/fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = kwargs.pop("tags", []) + ["fuzzer"],
        **kwargs
    )
