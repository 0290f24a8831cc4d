"""A Python client for reshardd, the reshard checkpoint conversion daemon.

reshardd converts large-model training checkpoints (DeepSpeed ZeRO, PyTorch FSDP/DCP, Megatron,
metaseq, safetensors, torch.save) on the machine it runs on. This module submits conversion jobs
to it over gRPC (the `reshard.v1.Reshard` service in proto/reshard/v1/reshard.proto), follows
them and cancels them; it is what `reshardctl --server` does, for Python programs and workflow
engines (Airflow, Flyte, Prefect, Snakemake ``run:`` blocks, notebooks)::

    from reshard_client import Client, ReshardError

    with Client("reshardd.example.org:50051", token=os.environ.get("RESHARD_TOKEN"),
                tls_ca="/etc/reshard/ca.pem") as client:
        job_id = client.consolidate("/data/run7/ckpt", "/data/run7/hf", dtype="bf16",
                                    max_shard_size="5GB", idempotency_key="run7-hf")
        for job in client.watch(job_id):           # optional: progress as it happens
            print(job.state, job.progress.fraction)
        try:
            job = client.wait(job_id, timeout=3600)  # a Job in state "SUCCEEDED"
        except ReshardError as e:
            print(e.code, e.message)                 # e.g. "DATA_LOSS", "... CRC-32 ..."
            raise
        print([f.name for f in job.output_files])

Paths are paths on the daemon's machine and must lie under one of its ``--allowed-root``
folders; relative paths are made absolute against this process's working directory, as
reshardctl does. Conversion options are keyword arguments named as the `JobSpec` fields of the
API (``dtype``, ``max_shard_size``, ``output_format``, ``priority``, ``threads``,
``window_bytes``, ``memory_budget``, ``overwrite``, ``tag``, ``include_optimizer``, ``io``,
``partition_index``, ``partition_count``, ...; see ``Client.OPTIONS``); an unknown keyword raises
TypeError naming it.

Errors: every failure the daemon reports, whether a refused call (``PERMISSION_DENIED`` for a
path outside the roots, ``FAILED_PRECONDITION`` for a non-empty output, ...) or a job that ended
FAILED or CANCELLED, raises ``ReshardError`` with the gRPC/absl code name (``e.code``), its number
(``e.code_value``), the message, and for jobs the `Job` (``e.job``); ``e.exit_code`` is the exit
code reshardctl would use. A ``wait`` that runs out of time raises the built-in TimeoutError (the
job goes on in the daemon).

Transport: plaintext by default; TLS when ``tls_ca`` (the CA that signed the daemon's
certificate; None with ``tls=True`` uses the system roots) is given, mutual TLS with
``tls_cert`` and ``tls_key``. A bearer token is sent on every call as the ``authorization:
Bearer TOKEN`` metadata. Calls that are safe to repeat (get, list, cancel, watch, plan, inspect,
and submits that carry an idempotency key) are retried with exponential backoff while the daemon
is UNAVAILABLE (restarting or draining).

Build (stubs generated with Debian's protoc and grpc_python_plugin, no pip)::

    bazel build //clients/python:reshard_client
    PYTHONPATH=bazel-bin/clients/python /usr/bin/python3 -c "import reshard_client"

Requires python3-grpcio and python3-protobuf (grpcio 1.51, protobuf 3.21 on Debian 12).
"""

import dataclasses
import json
import os
import re
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import json_format

from reshard.v1 import reshard_pb2 as pb
from reshard.v1 import reshard_pb2_grpc as pb_grpc

__all__ = [
    "Client",
    "Job",
    "JobError",
    "OutputFile",
    "Progress",
    "Plan",
    "PlannedFile",
    "Inspection",
    "TensorInfo",
    "ReshardError",
    "JobFailedError",
    "STATES",
    "TERMINAL_STATES",
    "parse_size",
]

__version__ = "1.0.0"

# Job states as the strings Job.state takes (the reshard.v1.JobState names without the prefix).
STATES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")

_MAX_MESSAGE = 64 << 20
_MAX_RULES = 1 << 20

# The trailing metadata key that marks a refused SubmitJob or Plan as a usage error: a JobSpec
# field given to a job that does not read it (its value: reshardctl's flag, "--family").
_USAGE_ERROR_KEY = "reshard-usage-error"

# reshardctl's exit codes (README, "Exit codes") by status code name.
_EXIT_CODES = {
    "OK": 0,
    "INVALID_ARGUMENT": 3, "NOT_FOUND": 3, "DATA_LOSS": 3, "FAILED_PRECONDITION": 3,
    "UNIMPLEMENTED": 3, "OUT_OF_RANGE": 3, "ALREADY_EXISTS": 3, "PERMISSION_DENIED": 3,
    "UNAUTHENTICATED": 3,
    "CANCELLED": 5,
    "RESOURCE_EXHAUSTED": 6,
    "UNAVAILABLE": 7, "DEADLINE_EXCEEDED": 7,
}

# ------------------------------------------------------------------------------------------------
# Errors


class ReshardError(Exception):
    """A call the daemon refused, or a job that ended FAILED or CANCELLED.

    Attributes:
        code: the status code name, e.g. "INVALID_ARGUMENT", "PERMISSION_DENIED", "DATA_LOSS",
            "CANCELLED", "UNAVAILABLE" (gRPC and absl share the names and numbers).
        code_value: the code's number (google.rpc.Code), e.g. 15 for DATA_LOSS.
        message: the daemon's message (names the file, tensor or field concerned).
        job: the Job, when a job failed (None for a refused call).
        job_id: the job's id, when one is concerned.
        usage_error: the call or job was refused for an option (JobSpec field) it does not
            read, e.g. hf_family for a safetensors output; reshardctl exits 2 for it.
        exit_code: the exit code reshardctl gives for this error (2 a usage error, 3 invalid
            input, 5 cancelled, 6 resource exhausted, 7 unavailable, 1 otherwise).
    """

    def __init__(self, code: str, message: str, code_value: Optional[int] = None,
                 job: Optional["Job"] = None, job_id: Optional[str] = None,
                 usage_error: bool = False):
        self.code = code
        self.code_value = _code_value(code) if code_value is None else code_value
        self.message = message
        self.job = job
        self.job_id = job_id if job_id is not None else (job.id if job is not None else None)
        self.usage_error = usage_error or (job is not None and job.error is not None and
                                           job.error.usage_error)
        where = " (job %s)" % self.job_id if self.job_id else ""
        super().__init__("%s%s: %s" % (code, where, message))

    @property
    def exit_code(self) -> int:
        if self.usage_error:
            return 2
        return _EXIT_CODES.get(self.code, 1)


class JobFailedError(ReshardError):
    """A job ended in state FAILED or CANCELLED (``e.job`` holds it, ``e.job.error`` the cause)."""


def _code_value(name: str) -> int:
    for code in grpc.StatusCode:
        if code.name == name:
            return code.value[0]
    return 2  # UNKNOWN


def _from_rpc_error(error: grpc.RpcError, job_id: Optional[str] = None,
                    target: Optional[str] = None) -> ReshardError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code == grpc.StatusCode.UNAVAILABLE and target:
        details = "reshardd at %s is unavailable: %s" % (target, details)
    trailing = (error.trailing_metadata() if hasattr(error, "trailing_metadata") else None) or ()
    usage_error = any(key == _USAGE_ERROR_KEY for key, _ in trailing)
    return ReshardError(code.name, details, code.value[0], job_id=job_id, usage_error=usage_error)


# ------------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a job is: bytes, tensors and output files done out of the totals (0 until the
    job has planned)."""

    bytes_done: int = 0
    bytes_total: int = 0
    tensors_done: int = 0
    tensors_total: int = 0
    files_done: int = 0
    files_total: int = 0

    @property
    def fraction(self) -> float:
        """bytes_done / bytes_total, 0.0 before planning."""
        return self.bytes_done / self.bytes_total if self.bytes_total else 0.0

    @classmethod
    def _from_proto(cls, p: "pb.Progress") -> "Progress":
        return cls(p.bytes_done, p.bytes_total, p.tensors_done, p.tensors_total, p.files_done,
                   p.files_total)


@dataclasses.dataclass(frozen=True)
class JobError:
    """Why a job failed or was cancelled."""

    code: str        # "DATA_LOSS"
    code_value: int  # 15
    message: str
    # A flag (JobSpec field) the job does not read, refused once the input was read: reshardctl
    # exits 2 for it.
    usage_error: bool = False


@dataclasses.dataclass(frozen=True)
class OutputFile:
    """A file of a job's output (from its manifest) with its size and XXH3-64 (16 hex digits)."""

    name: str
    bytes: int
    xxh3_64: str


@dataclasses.dataclass(frozen=True)
class Job:
    """A snapshot of a job in reshardd.

    ``state`` is one of STATES ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED") and
    ``kind`` "CONSOLIDATE" or "RESHARD". ``spec`` is the JobSpec as a dict of its set fields
    (proto JSON names, e.g. {"kind": "JOB_KIND_CONSOLIDATE", "input": ..., "dtype":
    "DTYPE_BF16"}); ``timings`` the seconds per phase (plan, write, publish, ...). Times are Unix
    seconds (0.0 when not reached). ``owner`` is the name of the bearer token that submitted
    the job ("" on a daemon without tokens). ``proto`` is the reshard.v1.Job message itself.
    """

    id: str
    state: str
    kind: str
    input: str
    output: str
    idempotency_key: str
    spec: Dict[str, Any]
    progress: Progress
    timings: Dict[str, float]
    created_unix: float
    started_unix: float
    finished_unix: float
    reserved_memory_bytes: int
    peak_rss_bytes: int
    bytes_read: int
    bytes_written: int
    error: Optional[JobError]
    output_files: List[OutputFile]
    attempts: int
    note: str
    owner: str
    proto: Any = dataclasses.field(repr=False, compare=False)

    @property
    def done(self) -> bool:
        """True once the job is SUCCEEDED, FAILED or CANCELLED."""
        return self.state in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "SUCCEEDED"

    def to_dict(self) -> Dict[str, Any]:
        """The job as the JSON object reshardctl prints under "job" (proto field names)."""
        return json_format.MessageToDict(self.proto, preserving_proto_field_name=True)

    def raise_for_state(self) -> "Job":
        """Raises JobFailedError if the job FAILED or was CANCELLED; returns the job otherwise."""
        if self.state in ("FAILED", "CANCELLED"):
            err = self.error or JobError("CANCELLED" if self.state == "CANCELLED" else "UNKNOWN",
                                         1 if self.state == "CANCELLED" else 2,
                                         "job %s" % self.state.lower())
            raise JobFailedError(err.code, err.message, err.code_value, job=self)
        return self

    @classmethod
    def _from_proto(cls, j: "pb.Job") -> "Job":
        error = None
        if j.HasField("error") and (j.error.code or j.error.message):
            error = JobError(j.error.code_name or _code_name(j.error.code), j.error.code,
                             j.error.message, j.error.usage_error)
        timings = {f.name[:-len("_seconds")]: getattr(j.timings, f.name)
                   for f in j.timings.DESCRIPTOR.fields}
        return cls(
            id=j.id,
            state=pb.JobState.Name(j.state)[len("JOB_STATE_"):],
            kind=pb.JobKind.Name(j.spec.kind)[len("JOB_KIND_"):],
            input=j.spec.input,
            output=j.spec.output,
            idempotency_key=j.idempotency_key,
            spec=json_format.MessageToDict(j.spec, preserving_proto_field_name=True),
            progress=Progress._from_proto(j.progress),
            timings=timings,
            created_unix=j.created_unix,
            started_unix=j.started_unix,
            finished_unix=j.finished_unix,
            reserved_memory_bytes=j.reserved_memory_bytes,
            peak_rss_bytes=j.peak_rss_bytes,
            bytes_read=j.bytes_read,
            bytes_written=j.bytes_written,
            error=error,
            output_files=[OutputFile(f.name, f.bytes, f.xxh3_64) for f in j.output_files],
            attempts=j.attempts,
            note=j.note,
            owner=j.owner,
            proto=j,
        )


def _code_name(value: int) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code.name
    return "UNKNOWN"


@dataclasses.dataclass(frozen=True)
class PlannedFile:
    name: str
    bytes: int
    tensors: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """A dry run: the files a job would write (data files first, then the index and other
    companion files), their bytes, what it reads, and the working memory it needs."""

    files: List[PlannedFile]
    total_bytes: int
    source_bytes_read: int
    memory_bytes: int
    data_files: int
    proto: Any = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str          # safetensors name: "F32", "BF16", ...
    shape: List[int]
    bytes: int
    pieces: int


@dataclasses.dataclass(frozen=True)
class Inspection:
    """What a checkpoint holds: format, layout ("single-file", "sharded",
    "model-parallel-parts"), files, tensors and non-tensor metadata."""

    format: str
    layout: str
    parts: int
    merged: bool
    files: List[Tuple[str, int]]
    total_bytes: int
    tensors: List[TensorInfo]
    metadata: Dict[str, str]
    description: str
    proto: Any = dataclasses.field(repr=False, compare=False)


# ------------------------------------------------------------------------------------------------
# Option parsing

_SIZE_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9,
}


def parse_size(value: Union[int, str]) -> int:
    """Bytes from an int or a size text as reshardctl takes it: "5GB" (decimal, 5*10^9),
    "512MiB" (binary), "1048576"."""
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string like '5GB', not %r" % (value,))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size %d is negative" % value)
        return value
    if not isinstance(value, str):
        raise TypeError("a size must be an int or a string like '5GB', not %r" % (value,))
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", value)
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise ValueError("invalid size %r; expected e.g. 5GB, 500MB, 2GiB, 1048576" % value)
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


_DTYPES = {
    "keep": pb.DTYPE_KEEP, "": pb.DTYPE_KEEP,
    "fp32": pb.DTYPE_FP32, "f32": pb.DTYPE_FP32, "float32": pb.DTYPE_FP32,
    "bf16": pb.DTYPE_BF16, "bfloat16": pb.DTYPE_BF16,
    "fp16": pb.DTYPE_FP16, "f16": pb.DTYPE_FP16, "float16": pb.DTYPE_FP16, "half": pb.DTYPE_FP16,
}

_SIZE_FIELDS = ("max_shard_size", "memory_budget", "window_bytes")

# JobSpec fields set by the methods' positional arguments, not by keyword options.
_POSITIONAL_FIELDS = ("kind", "input", "output", "parts", "rules_json")
# Keyword options that are paths: made absolute against the caller's folder, as input and output.
_PATH_FIELDS = ("tokenizer", "hf_config_file")


def _dtype(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in pb.DType.values():
            raise ValueError("dtype %d is not a reshard.v1.DType" % value)
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in _DTYPES:
            return _DTYPES[key]
        if value.upper() in pb.DType.keys():
            return pb.DType.Value(value.upper())
    raise ValueError("dtype %r: use 'keep', 'fp32', 'bf16' or 'fp16'" % (value,))


def _rules_json(rules: Any) -> str:
    """Partition rules as JSON text: a dict ({"rules": [...]}), JSON text, or a file path."""
    if rules is None:
        return ""
    if isinstance(rules, Mapping):
        text = json.dumps(rules)
    elif isinstance(rules, (str, os.PathLike)):
        s = os.fspath(rules)
        if s.lstrip().startswith("{"):
            text = s
        else:
            size = os.path.getsize(s)  # FileNotFoundError names the path
            if size > _MAX_RULES:
                raise ValueError("partition rules file %s is larger than 1 MiB" % s)
            with open(s, encoding="utf-8") as f:
                text = f.read()
        try:
            json.loads(text)
        except ValueError as e:
            raise ValueError("partition rules are not valid JSON: %s" % e) from None
    else:
        raise TypeError("rules must be a dict, JSON text or a path, not %s" % type(rules).__name__)
    if len(text.encode("utf-8")) > _MAX_RULES:
        raise ValueError("partition rules are larger than 1 MiB")
    return text


def _absolute(path: Any) -> str:
    p = os.fspath(path)
    if not p or "://" in p:  # remote URLs go as they are: the daemon decides
        return p
    return os.path.normpath(os.path.abspath(p))


def _states(state: Union[None, str, Iterable[str]]) -> List[int]:
    if state is None:
        return []
    items = [state] if isinstance(state, str) else list(state)
    out = []
    for s in items:
        name = str(s).upper()
        if not name.startswith("JOB_STATE_"):
            name = "JOB_STATE_" + name
        if name not in pb.JobState.keys() or name == "JOB_STATE_UNSPECIFIED":
            raise ValueError("unknown job state %r; use one of %s" % (s, ", ".join(STATES)))
        out.append(pb.JobState.Value(name))
    return out


def _read_pem(value: Union[None, str, bytes, os.PathLike]) -> Optional[bytes]:
    """PEM bytes from a file path, or the PEM text itself (bytes, or str with a BEGIN line)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and "-----BEGIN " in value:
        return value.encode("ascii")
    with open(os.fspath(value), "rb") as f:
        return f.read()


# ------------------------------------------------------------------------------------------------
# Client


class Client:
    """A connection to one reshardd.

    Args:
        target: "HOST:PORT" of the daemon (what `reshardd` prints as "listening on ...").
        token: a bearer token, sent as "authorization: Bearer TOKEN" on every call.
        tls_ca: the CA that signed the daemon's certificate, as a PEM file path or the PEM
            itself (bytes, or text with its BEGIN line); turns TLS on.
        tls_cert, tls_key: client certificate and key for mutual TLS (both or neither), as
            tls_ca.
        tls: force TLS with the system's root CAs when no tls_ca is given.
        tls_server_name: the name to verify in the daemon's certificate, when it differs from
            the host in `target`.
        token_file: read the token from this file (trailing whitespace stripped).
        rpc_timeout: seconds allowed for each unary call (not for waiting on jobs).
        max_attempts: tries of a retryable call while the daemon is UNAVAILABLE.
        initial_backoff, max_backoff: seconds between those tries (doubling).
        channel_options: extra grpc channel arguments [(name, value), ...].

    The client is thread-safe (one gRPC channel) and a context manager (``close()`` at exit).
    """

    #: Keyword options of consolidate/reshard/plan: the JobSpec fields (see the proto for each).
    OPTIONS = tuple(f.name for f in pb.JobSpec.DESCRIPTOR.fields
                    if f.name not in _POSITIONAL_FIELDS)

    def __init__(self, target: str, token: Optional[str] = None,
                 tls_ca: Union[None, str, bytes, os.PathLike] = None,
                 tls_cert: Union[None, str, bytes, os.PathLike] = None,
                 tls_key: Union[None, str, bytes, os.PathLike] = None, *,
                 tls: bool = False, tls_server_name: Optional[str] = None,
                 token_file: Union[None, str, os.PathLike] = None,
                 rpc_timeout: float = 60.0, max_attempts: int = 5,
                 initial_backoff: float = 0.2, max_backoff: float = 5.0,
                 channel_options: Sequence[Tuple[str, Any]] = ()):
        if not target:
            raise ValueError("no daemon address given")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together (mutual TLS needs both)")
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        if token_file is not None:
            with open(os.fspath(token_file), encoding="utf-8") as f:
                token = f.read().strip()
            if not token:
                raise ValueError("token file %s is empty" % os.fspath(token_file))
        if token is not None and (not token or any(c in token for c in "\r\n")):
            raise ValueError("the token is empty or holds a line break")
        self.target = target
        self.rpc_timeout = rpc_timeout
        self.max_attempts = max(1, int(max_attempts))
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                   ("grpc.max_send_message_length", 4 << 20)]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        options.extend(channel_options)
        self.tls = bool(tls or tls_ca is not None or tls_cert is not None)
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(tls_ca), private_key=_read_pem(tls_key),
                certificate_chain=_read_pem(tls_cert))
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.ReshardStub(self._channel)

    @classmethod
    def from_env(cls, target: Optional[str] = None, **kwargs: Any) -> "Client":
        """A client configured as reshardctl is from the environment: RESHARD_SERVER (unless
        `target` is given), RESHARD_TOKEN, RESHARD_TLS_CA, RESHARD_TLS_CERT, RESHARD_TLS_KEY."""
        target = target or os.environ.get("RESHARD_SERVER")
        if not target:
            raise ValueError("no target given and RESHARD_SERVER is not set")
        env = {"token": "RESHARD_TOKEN", "tls_ca": "RESHARD_TLS_CA",
               "tls_cert": "RESHARD_TLS_CERT", "tls_key": "RESHARD_TLS_KEY"}
        for arg, var in env.items():
            if arg not in kwargs and os.environ.get(var):
                kwargs[arg] = os.environ[var]
        return cls(target, **kwargs)

    def close(self) -> None:
        """Closes the channel (open watch iterators end)."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r, tls=%s, token=%s)" % (self.target, self.tls,
                                                   "set" if self._metadata else "none")

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, method: str, request: Any, retry: bool, job_id: Optional[str] = None,
              timeout: Optional[float] = None) -> Any:
        backoff = self.initial_backoff
        attempts = self.max_attempts if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return getattr(self._stub, method)(
                    request, timeout=self.rpc_timeout if timeout is None else timeout,
                    metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts:
                    raise _from_rpc_error(e, job_id, self.target) from None
            time.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)
        raise AssertionError("unreachable")

    def _spec(self, method: str, kind: int, input: Any, output: Any,
              options: Dict[str, Any], parts: int = 0, rules: Any = None) -> "pb.JobSpec":
        unknown = sorted(k for k in options if k not in self.OPTIONS)
        if unknown:
            extra = ("rules", "idempotency_key") if method == "consolidate" else \
                ("idempotency_key",) if method == "reshard" else ()
            raise TypeError("%s() got unexpected keyword argument%s %s; options are %s" % (
                method, "s" if len(unknown) > 1 else "", ", ".join(repr(k) for k in unknown),
                ", ".join(self.OPTIONS + extra)))
        spec = pb.JobSpec(kind=kind, input=_absolute(input), output=_absolute(output))
        if parts:
            spec.parts = _int_option("parts", parts)
        spec.rules_json = _rules_json(rules)
        for name, value in options.items():
            if value is None:
                continue  # None: the daemon's default, like leaving the keyword out
            field = pb.JobSpec.DESCRIPTOR.fields_by_name[name]
            if name == "dtype":
                value = _dtype(value)
            elif name in _SIZE_FIELDS:
                value = parse_size(value)
            elif field.type == field.TYPE_BOOL:
                if not isinstance(value, bool):
                    raise TypeError("%s must be True or False, not %r" % (name, value))
            elif name in _PATH_FIELDS:
                value = _absolute(value)  # a folder on the daemon's machine, as input/output
            elif field.type == field.TYPE_STRING:
                if not isinstance(value, str):
                    raise TypeError("%s must be a string, not %r" % (name, value))
            else:
                value = _int_option(name, value)
            try:
                setattr(spec, name, value)
            except (TypeError, ValueError) as e:
                raise ValueError("%s=%r: %s" % (name, value, e)) from None
        return spec

    def _submit(self, spec: "pb.JobSpec", idempotency_key: Optional[str]) -> str:
        key = idempotency_key or ""
        if len(key.encode("utf-8")) > 256:
            raise ValueError("idempotency_key is longer than 256 bytes")
        job = self._call("SubmitJob", pb.SubmitJobRequest(spec=spec, idempotency_key=key),
                         retry=bool(key))
        return job.id

    def consolidate(self, input: Union[str, os.PathLike], output: Union[str, os.PathLike], *,
                    rules: Any = None, idempotency_key: Optional[str] = None,
                    **options: Any) -> str:
        """Queues a job that writes the checkpoint at `input` as one model in `output`.

        Args:
            input: a checkpoint file or folder (safetensors, torch.save, DeepSpeed, DCP,
                Megatron, ...) on the daemon's machine.
            output: the output folder; must not exist or be empty unless overwrite=True.
            rules: partition rules, needed to merge model-parallel parts: a dict
                ({"rules": [{"pattern": ..., "split_dim": 0}, ...]}), JSON text or a file path.
            idempotency_key: a repeated submit with the same key and spec returns the same job
                (and may be retried safely); the same key with another spec is ALREADY_EXISTS.
            **options: JobSpec fields: dtype ("keep", "fp32", "bf16", "fp16"), max_shard_size
                (bytes or "5GB"), output_format ("safetensors", "torch", ...), priority
                (-100..100), threads, window_bytes, memory_budget, overwrite, duplicate_tied,
                tag, include_optimizer, skip_crc_check, update_latest, io ("auto", "direct",
                "buffered"), partition_index, partition_count, pipeline_parts, expert_parts
                (reshard to output_format "megatron" or "megatron-torch-dist":
                expert-parallel ranks), no_extra_files
                (leave out a Hugging Face input's config.json, tokenizer, README and licence),
                tokenizer (a folder whose tokenizer files are carried into the output),
                hf_family, hf_config_file (output_format "hf", and a Hugging Face input
                imported with output_format "megatron" or "megatron-torch-dist": the family
                its weights are read as, the config.json read in place of the folder's),
                hf_vocab_size (output_format "hf").

        Returns:
            The job id. Follow it with wait(), watch() or get().

        Raises:
            TypeError: an unknown keyword (named in the message).
            ReshardError: the daemon refused the job (e.g. PERMISSION_DENIED for a path outside
                its roots, FAILED_PRECONDITION for a non-empty output, NOT_FOUND).
        """
        spec = self._spec("consolidate", pb.JOB_KIND_CONSOLIDATE, input, output, options,
                          rules=rules)
        return self._submit(spec, idempotency_key)

    def reshard(self, input: Union[str, os.PathLike], output: Union[str, os.PathLike],
                parts: int, rules: Any = None, *, idempotency_key: Optional[str] = None,
                **options: Any) -> str:
        """Queues a job that writes `input` as `parts` tensor-parallel parts in `output`.

        Args:
            input, output: as for consolidate().
            parts: the number of output parts (>= 1).
            rules: the partition rules (which tensors split along which dimension, which are
                replicated): a dict ({"rules": [...]}), JSON text, or a path to a JSON file.
                May be None when the input format brings its own (Megatron).
            idempotency_key, **options: as for consolidate().

        Returns:
            The job id.
        """
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            raise ValueError("parts must be an int >= 1, not %r" % (parts,))
        spec = self._spec("reshard", pb.JOB_KIND_RESHARD, input, output, options, parts=parts,
                          rules=rules)
        return self._submit(spec, idempotency_key)

    def get(self, job_id: str) -> Job:
        """The job's current state. Raises ReshardError NOT_FOUND for an unknown id."""
        return Job._from_proto(self._call("GetJob", pb.GetJobRequest(id=job_id), True, job_id))

    def cancel(self, job_id: str) -> Job:
        """Cancels a queued or running job (a running one stops at its next window and its
        temporary outputs are removed); returns the job. A finished job is returned unchanged."""
        return Job._from_proto(self._call("CancelJob", pb.CancelJobRequest(id=job_id), True,
                                          job_id))

    def list(self, state: Union[None, str, Iterable[str]] = None,
             limit: Optional[int] = 100) -> List[Job]:
        """Jobs newest first.

        Args:
            state: only jobs in this state or these states ("QUEUED", "RUNNING", "SUCCEEDED",
                "FAILED", "CANCELLED"; any case); None for all.
            limit: at most this many jobs (pages are fetched as needed); None for all.
        """
        states = _states(state)
        if limit is not None and (isinstance(limit, bool) or limit < 1):
            raise ValueError("limit must be >= 1 or None, not %r" % (limit,))
        jobs: List[Job] = []
        token = ""
        while limit is None or len(jobs) < limit:
            page = 1000 if limit is None else min(1000, limit - len(jobs))
            response = self._call("ListJobs", pb.ListJobsRequest(
                states=states, page_size=page, page_token=token), True)
            jobs.extend(Job._from_proto(j) for j in response.jobs)
            token = response.next_page_token
            if not token or not response.jobs:
                break
        return jobs if limit is None else jobs[:limit]

    def watch(self, job_id: str, timeout: Optional[float] = None) -> Iterator[Job]:
        """Yields the job each time it changes (state changes, and progress a few times a
        second) until it is SUCCEEDED, FAILED or CANCELLED; the last item is the final state.
        Job failures do not raise here (look at the last item's state, or use wait()).

        If the daemon restarts meanwhile, watching resumes (jobs survive restarts). Breaking
        out of the loop ends the stream. `timeout` (seconds) raises TimeoutError when the job
        has not ended by then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = self.initial_backoff
        failures = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("job %s did not end within %ss" % (job_id, timeout))
            stream = self._stub.WatchJob(pb.WatchJobRequest(id=job_id), timeout=remaining,
                                         metadata=self._metadata)
            last = None
            try:
                for event in stream:
                    failures = 0
                    backoff = self.initial_backoff
                    last = Job._from_proto(event.job)
                    yield last
                    if last.done:
                        return
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                    raise TimeoutError("job %s did not end within %ss" % (job_id, timeout)) \
                        from None
                if code != grpc.StatusCode.UNAVAILABLE:
                    raise _from_rpc_error(e, job_id, self.target) from None
                failures += 1
                if failures >= self.max_attempts and not _daemon_back_soon(deadline):
                    raise _from_rpc_error(e, job_id, self.target) from None
                time.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            finally:
                stream.cancel()  # no-op once ended; ends the call when the caller breaks out
            # The stream ended without a terminal event (daemon draining): look again.
            if last is None or not last.done:
                job = self.get(job_id)
                if job.done:
                    yield job
                    return
                time.sleep(backoff)

    def wait(self, job_id: str, timeout: Optional[float] = None, check: bool = True) -> Job:
        """Waits until the job ends and returns it (state "SUCCEEDED").

        Args:
            timeout: seconds to wait at most; None waits as long as the job runs.
            check: raise on FAILED/CANCELLED (default); with False the job is returned in
                whatever terminal state it reached.

        Raises:
            JobFailedError (a ReshardError): the job FAILED or was CANCELLED; e.code is its
                error code ("DATA_LOSS", "CANCELLED", ...), e.message the daemon's message,
                e.job the job.
            TimeoutError: the job had not ended after `timeout` seconds (it goes on).
            ReshardError: the job is unknown (NOT_FOUND) or the daemon stayed unreachable.
        """
        job = None
        for job in self.watch(job_id, timeout=timeout):
            pass
        if job is None:  # an empty stream ended; ask directly
            job = self.get(job_id)
        return job.raise_for_state() if check else job

    def plan(self, input: Union[str, os.PathLike], output: Union[None, str, os.PathLike] = None,
             parts: int = 0, rules: Any = None, **options: Any) -> Plan:
        """A dry run: the output files, bytes and memory a conversion would need; writes nothing.

        With parts=0 it plans a consolidation, otherwise a reshard into `parts` parts. `output`
        only matters where the daemon checks it (default: INPUT.plan). Options as for
        consolidate() (idempotency_key is not taken).
        """
        kind = pb.JOB_KIND_RESHARD if parts else pb.JOB_KIND_CONSOLIDATE
        if output is None:
            output = _absolute(input).rstrip("/") + ".plan"
        spec = self._spec("plan", kind, input, output, options, parts=parts, rules=rules)
        r = self._call("Plan", pb.PlanRequest(spec=spec), True)
        return Plan([PlannedFile(f.name, f.bytes, f.tensors) for f in r.files], r.total_bytes,
                    r.source_bytes_read, r.memory_bytes, r.data_files, r)

    def inspect(self, input: Union[str, os.PathLike], rules: Any = None, tag: str = "",
                include_optimizer: bool = False) -> Inspection:
        """Describes a checkpoint: format, layout, files, tensors (name, dtype, shape, bytes)
        and metadata. `rules` merges model-parallel parts; `tag` picks a DeepSpeed/Megatron
        checkpoint in a save folder; include_optimizer adds the Adam moments."""
        r = self._call("Inspect", pb.InspectRequest(
            input=_absolute(input), rules_json=_rules_json(rules), tag=tag,
            include_optimizer=include_optimizer), True)
        return Inspection(r.format, r.layout, r.parts, r.merged,
                          [(f.path, f.bytes) for f in r.files], r.total_bytes,
                          [TensorInfo(t.name, t.dtype, list(t.shape), t.bytes, t.pieces)
                           for t in r.tensors],
                          dict(r.metadata), r.description, r)


def _int_option(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int, not %r" % (name, value))
    return value


def _daemon_back_soon(deadline: Optional[float]) -> bool:
    """While waiting with a deadline, keep retrying an unreachable daemon until it passes."""
    return deadline is not None and time.monotonic() < deadline
