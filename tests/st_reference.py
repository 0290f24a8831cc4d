"""Independent safetensors reference reader/writer used by the reshard e2e tests.

Only json, struct and numpy are used; nothing here calls reshard.  The rules implemented follow
the safetensors format (header u64 LE length, UTF-8 JSON header, contiguous data buffer) and
the reference (Rust) writer's conventions: tensors sorted by dtype descending then name, header
padded with spaces to a multiple of 8, `__metadata__` = {"format": "pt"}.

Tensor values are returned as `Tensor(dtype, array)`:
  * F32/F64/F16 -> numpy float arrays; BF16 -> uint16 bit patterns; F8_* -> uint8 bit patterns;
  * integer dtypes -> the matching numpy integer array; BOOL -> numpy bool_.
`Tensor.raw()` gives the exact little-endian bytes, which is what bit-exact comparisons use.
"""

import collections
import json
import os
import re
import struct

import numpy as np

# dtype -> (bits, numpy storage dtype).  Storage dtype is the numpy type used to hold the bits.
DTYPES = collections.OrderedDict([
    # Increasing order of the Rust `Dtype` enum (safetensors/src/tensor.rs).
    ("BOOL", (8, np.dtype(np.bool_))),
    ("F4", (4, None)),
    ("F6_E2M3", (6, None)),
    ("F6_E3M2", (6, None)),
    ("U8", (8, np.dtype("<u1"))),
    ("I8", (8, np.dtype("<i1"))),
    ("F8_E5M2", (8, np.dtype("<u1"))),
    ("F8_E4M3", (8, np.dtype("<u1"))),
    ("F8_E8M0", (8, np.dtype("<u1"))),
    ("F8_E4M3FNUZ", (8, np.dtype("<u1"))),
    ("F8_E5M2FNUZ", (8, np.dtype("<u1"))),
    ("I16", (16, np.dtype("<i2"))),
    ("U16", (16, np.dtype("<u2"))),
    ("F16", (16, np.dtype("<f2"))),
    ("BF16", (16, np.dtype("<u2"))),
    ("I32", (32, np.dtype("<i4"))),
    ("U32", (32, np.dtype("<u4"))),
    ("F32", (32, np.dtype("<f4"))),
    ("C64", (64, np.dtype("<c8"))),
    ("F64", (64, np.dtype("<f8"))),
    ("I64", (64, np.dtype("<i8"))),
    ("U64", (64, np.dtype("<u8"))),
])
DTYPE_RANK = {name: i for i, name in enumerate(DTYPES)}
FLOAT_CONVERTIBLE = ("F32", "F16", "BF16")
MAX_HEADER = 100_000_000
INDEX_NAME = "model.safetensors.index.json"


class FormatError(Exception):
    pass


class Tensor(collections.namedtuple("Tensor", ["dtype", "array"])):
    """A tensor: safetensors dtype tag plus a numpy array of the storage dtype."""

    @property
    def shape(self):
        return tuple(self.array.shape)

    def raw(self):
        return np.ascontiguousarray(self.array).tobytes()

    @property
    def nbytes(self):
        return nbytes_of(self.dtype, self.shape)


def nbytes_of(dtype, shape):
    bits = DTYPES[dtype][0]
    n = 1
    for d in shape:
        n *= int(d)
    total_bits = n * bits
    if total_bits % 8:
        raise FormatError("misaligned %s tensor of shape %s" % (dtype, list(shape)))
    return total_bits // 8


def make_tensor(dtype, array):
    """Wrap `array` (already in storage form or convertible) as a Tensor of `dtype`."""
    storage = DTYPES[dtype][1]
    arr = np.asarray(array)
    if arr.dtype != storage:
        arr = arr.astype(storage)
    return Tensor(dtype, np.ascontiguousarray(arr))


# ----------------------------------------------------------------------------------------------
# Reading


def _reject_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise FormatError("duplicate key %r in header" % k)
        seen[k] = v
    return seen


def parse_header(path):
    """Validate a file and return (header_len, header_dict_in_file_order, metadata, data_start)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError("%s: file shorter than 8 bytes" % path)
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise FormatError("%s: header too large (%d)" % (path, n))
        if 8 + n > size:
            raise FormatError("%s: header length %d past end of file" % (path, n))
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError("%s: header is not UTF-8: %s" % (path, e))
    try:
        obj = json.loads(text, object_pairs_hook=_reject_duplicates)
    except ValueError as e:
        raise FormatError("%s: header is not valid JSON: %s" % (path, e))
    if not isinstance(obj, dict):
        raise FormatError("%s: header is not a JSON object" % path)
    metadata = obj.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise FormatError("%s: __metadata__ must map strings to strings" % path)
    entries = []
    for name, info in obj.items():
        if not isinstance(info, dict):
            raise FormatError("%s: tensor %s: not an object" % (path, name))
        dtype = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if dtype not in DTYPES or DTYPES[dtype][1] is None:
            raise FormatError("%s: tensor %s: unknown/unsupported dtype %r" % (path, name, dtype))
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FormatError("%s: tensor %s: bad shape %r" % (path, name, shape))
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
            raise FormatError("%s: tensor %s: bad data_offsets %r" % (path, name, offs))
        entries.append((name, dtype, tuple(shape), offs[0], offs[1]))
    pos = 0
    for name, dtype, shape, b, e in sorted(entries, key=lambda t: (t[3], t[4])):
        if b != pos or e < b:
            raise FormatError("%s: tensor %s: offsets [%d,%d) not contiguous (expected begin %d)"
                              % (path, name, b, e, pos))
        if e - b != nbytes_of(dtype, shape):
            raise FormatError("%s: tensor %s: %d bytes for %s %s" % (path, name, e - b, dtype,
                                                                     list(shape)))
        pos = e
    if 8 + n + pos != size:
        raise FormatError("%s: buffer is %d bytes, tensors need %d" % (path, size - 8 - n, pos))
    return n, entries, metadata, 8 + n


def read_file(path, with_metadata=False):
    """Read a safetensors file into an ordered dict name -> Tensor (file header order)."""
    n, entries, metadata, start = parse_header(path)
    out = collections.OrderedDict()
    with open(path, "rb") as f:
        for name, dtype, shape, b, e in entries:
            f.seek(start + b)
            buf = f.read(e - b)
            arr = np.frombuffer(buf, dtype=DTYPES[dtype][1]).reshape(shape).copy()
            out[name] = Tensor(dtype, arr)
    if with_metadata:
        return out, metadata
    return out


def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def list_safetensors(folder):
    return sorted((f for f in os.listdir(folder) if f.endswith(".safetensors")), key=natural_key)


def read_index(folder):
    with open(os.path.join(folder, INDEX_NAME), "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def read_folder(folder):
    """Read a one-model folder (with index, or several files with disjoint names) -> dict."""
    out = collections.OrderedDict()
    index_path = os.path.join(folder, INDEX_NAME)
    if os.path.exists(index_path):
        index = read_index(folder)
        wm = index["weight_map"]
        files = sorted(set(wm.values()), key=natural_key)
        for fn in files:
            tensors = read_file(os.path.join(folder, fn))
            for name, t in tensors.items():
                if wm.get(name) != fn:
                    raise FormatError("%s: tensor %s not mapped to this file by the index"
                                      % (fn, name))
                out[name] = t
        missing = set(wm) - set(out)
        if missing:
            raise FormatError("index names tensors not found: %s" % sorted(missing))
        return out
    for fn in list_safetensors(folder):
        for name, t in read_file(os.path.join(folder, fn)).items():
            if name in out:
                raise FormatError("tensor %s in more than one file" % name)
            out[name] = t
    return out


def read_parts(folder):
    """Read a folder of model-parallel parts -> list (natural file order) of dicts."""
    return [read_file(os.path.join(folder, fn)) for fn in list_safetensors(folder)]


def read_any(path):
    return read_folder(path) if os.path.isdir(path) else read_file(path)


# ----------------------------------------------------------------------------------------------
# Writing


def sort_key(name, dtype):
    return (-DTYPE_RANK[dtype], name)


def build_bytes(tensors, metadata=None):
    """Serialize like the reference writer.  `tensors`: mapping name -> Tensor."""
    if metadata is None:
        metadata = {"format": "pt"}
    order = sorted(tensors, key=lambda k: sort_key(k, tensors[k].dtype))
    header = collections.OrderedDict()
    if metadata:
        header["__metadata__"] = metadata
    pos = 0
    chunks = []
    for name in order:
        t = tensors[name]
        raw = t.raw()
        assert len(raw) == nbytes_of(t.dtype, t.shape), name
        header[name] = collections.OrderedDict([
            ("dtype", t.dtype), ("shape", list(t.shape)), ("data_offsets", [pos, pos + len(raw)])])
        pos += len(raw)
        chunks.append(raw)
    hjson = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    return struct.pack("<Q", len(hjson)) + hjson + b"".join(chunks)


def write_file(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(build_bytes(tensors, metadata))


def raw_file(header, data=b"", header_len=None, pad=True):
    """Craft a possibly-invalid file: `header` is a dict, str or bytes, written as given."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * ((8 - len(header) % 8) % 8)
    n = len(header) if header_len is None else header_len
    return struct.pack("<Q", n) + header + data


def hf_shard_name(i, n):
    return "model-%05d-of-%05d.safetensors" % (i, n)


def hf_split(items, limit):
    """Hugging Face split_state_dict_into_shards_factory: items = [(name, nbytes)] in order."""
    shards = []
    cur, cur_size = [], 0
    for name, size in items:
        if size > limit:
            shards.append([name])
            continue
        if cur_size + size > limit:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(name)
        cur_size += size
    if cur:
        shards.append(cur)
    return shards


def write_sharded(folder, tensors, groups):
    """Write `tensors` as an HF sharded folder: `groups` is a list of lists of names."""
    os.makedirs(folder, exist_ok=True)
    n = len(groups)
    wm = collections.OrderedDict()
    total = 0
    for i, names in enumerate(groups, 1):
        fn = hf_shard_name(i, n)
        write_file(os.path.join(folder, fn), {k: tensors[k] for k in names})
        for k in names:
            wm[k] = fn
            total += tensors[k].nbytes
    with open(os.path.join(folder, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


# ----------------------------------------------------------------------------------------------
# Float conversions (numpy reference)


def bf16_to_f32(bits):
    b = np.asarray(bits, dtype=np.uint16)
    return (b.reshape(-1).astype(np.uint32) << 16).view(np.float32).reshape(b.shape)


def bf16_rne(f32):
    """float32 array -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    f0 = np.asarray(f32, dtype=np.float32)
    f = np.ascontiguousarray(f0).reshape(-1)
    bits = f.view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    out[nan] = ((bits[nan] >> 16).astype(np.uint16) | np.uint16(0x0040))
    return out.reshape(f0.shape)


def f16_rne(f32):
    with np.errstate(all="ignore"):
        return np.asarray(f32, dtype=np.float32).astype(np.float16)


def to_f32(t):
    if t.dtype == "F32":
        return t.array
    if t.dtype == "F16":
        return t.array.astype(np.float32)
    if t.dtype == "BF16":
        return bf16_to_f32(t.array)
    raise ValueError(t.dtype)


TARGET = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}


def convert(t, target):
    """Reference --dtype conversion of a Tensor; `target` is keep|fp32|bf16|fp16."""
    if target == "keep" or t.dtype not in FLOAT_CONVERTIBLE:
        return t
    want = TARGET[target]
    if t.dtype == want:
        return t
    f = to_f32(t)
    if want == "F32":
        return Tensor("F32", f.copy())
    if want == "BF16":
        return Tensor("BF16", bf16_rne(f))
    return Tensor("F16", f16_rne(f))


def is_nan_bits(t):
    """Boolean mask of NaN elements for floating tensors (None for non-float dtypes)."""
    if t.dtype in ("F32", "F64", "F16"):
        return np.isnan(t.array)
    if t.dtype == "BF16":
        return np.isnan(bf16_to_f32(t.array))
    return None


def diff_tensors(expected, actual, nan_any=True):
    """Return None if equal bit-for-bit (any NaN == any NaN if nan_any), else a description."""
    if expected.dtype != actual.dtype:
        return "dtype %s != %s" % (actual.dtype, expected.dtype)
    if expected.shape != actual.shape:
        return "shape %s != %s" % (list(actual.shape), list(expected.shape))
    e = np.ascontiguousarray(expected.array).reshape(-1)
    a = np.ascontiguousarray(actual.array).reshape(-1)
    width = DTYPES[expected.dtype][1].itemsize
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    eb = e.view(view)
    ab = a.view(view)
    bad = eb != ab
    if nan_any:
        en = is_nan_bits(Tensor(expected.dtype, e))
        if en is not None:
            an = is_nan_bits(Tensor(actual.dtype, a))
            bad = np.where(en | an, en != an, bad)
    if not bad.any():
        return None
    idx = np.flatnonzero(bad)
    i = int(idx[0])
    return "%d mismatching elements, first at flat index %d: got bits 0x%x, expected 0x%x" % (
        len(idx), i, int(ab[i]), int(eb[i]))


# ----------------------------------------------------------------------------------------------
# Random checkpoints

_rng_default = None


def special_f32_bits():
    """Interesting float32 bit patterns (rounding ties, NaN payloads, subnormals, overflow)."""
    vals = [
        0x00000000, 0x80000000,              # +0, -0
        0x7F800000, 0xFF800000,              # +Inf, -Inf
        0x7FC00000, 0xFFC00000,              # quiet NaN +/-
        0x7F800001, 0xFF800001,              # NaN with payload only in the low 16 bits
        0x7FFFFFFF, 0xFFFFFFFF,              # NaN with all payload bits (naive RNE overflows)
        0x7FA00000,                          # signalling NaN with high payload
        0x00000001, 0x80000001,              # smallest subnormals
        0x007FFFFF, 0x00400000, 0x00008000,  # subnormals
        0x00800000,                          # smallest normal
        0x7F7FFFFF, 0xFF7FFFFF,              # max finite: rounds to Inf in bf16
        0x7F7F7FFF,                          # just below the tie that would overflow
        0x3F808000,                          # 1.00390625: tie, even below -> 0x3F80
        0x3F818000,                          # tie, odd below -> rounds up to 0x3F82
        0xBF808000, 0xBF818000,              # negative ties
        0x3F807FFF, 0x3F808001,              # just below / above the tie
        0x3F80FFFF,                          # rounds up with carry into mantissa
        0x3FFF8000,                          # tie with carry into exponent -> 0x4000
        0x00018000, 0x00008001,              # subnormal ties
        0x3F800000, 0xBF800000,              # +/-1
        # fp16-relevant values
        0x477FF000,                          # 65520: tie at fp16 max -> Inf
        0x477FEFFF,                          # 65519.99 -> 65504
        0x477FE000,                          # 65504: fp16 max
        0x33800000,                          # 2^-24: smallest fp16 subnormal
        0x33000000,                          # 2^-25: tie -> 0 (even)
        0x33400000,                          # 1.5*2^-25 -> 2^-24
        0x38800000,                          # 2^-14 smallest fp16 normal
        0x3F801000,                          # 1 + 2^-11: fp16 tie, even -> 1
        0x3F803000,                          # 1 + 3*2^-11: fp16 tie, odd -> up
        0x32000000,                          # tiny: underflows to 0 in fp16
    ]
    return np.array(vals, dtype=np.uint32)


def random_f32(rng, shape, specials=True):
    n = int(np.prod(shape)) if len(shape) else 1
    x = rng.standard_normal(n).astype(np.float32)
    if n and specials:
        sp = special_f32_bits().view(np.float32)
        # Random float bit patterns with low 16 bits exactly 0x8000 (bf16 ties).
        k = max(1, n // 8)
        ties = ((rng.integers(0, 1 << 16, k, dtype=np.uint32) << 16) | 0x8000).astype(np.uint32)
        ties = ties.view(np.float32)
        pos = rng.permutation(n)
        m = min(n, len(sp))
        x[pos[:m]] = sp[:m]
        t2 = min(n - m, len(ties))
        if t2 > 0:
            x[pos[m:m + t2]] = ties[:t2]
    return x.reshape(shape)


def random_tensor(rng, dtype, shape, specials=True):
    shape = tuple(shape)
    n = int(np.prod(shape)) if len(shape) else 1
    if dtype == "F32":
        return Tensor("F32", random_f32(rng, shape, specials))
    if dtype == "F16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        half = n // 2
        vals = rng.standard_normal(half).astype(np.float16).view(np.uint16)
        bits[:half] = vals
        if specials and n >= 8:
            sp = np.array([0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x8000, 0x0001, 0x03FF, 0x7BFF],
                          dtype=np.uint16)
            bits[half:half + len(sp)] = sp[:max(0, n - half)]
        return Tensor("F16", bits.view(np.float16).reshape(shape).copy())
    if dtype == "BF16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        half = n // 2
        bits[:half] = bf16_rne(rng.standard_normal(half).astype(np.float32))
        if specials and n >= 8:
            sp = np.array([0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x8000, 0x0001, 0x007F, 0x7F7F],
                          dtype=np.uint16)
            bits[half:half + len(sp)] = sp[:max(0, n - half)]
        return Tensor("BF16", bits.reshape(shape))
    if dtype == "F64":
        x = rng.standard_normal(n)
        if specials and n >= 6:
            x[:6] = [np.nan, np.inf, -np.inf, -0.0, 5e-324, 1e308]
        return Tensor("F64", x.reshape(shape))
    if dtype == "BOOL":
        return Tensor("BOOL", (rng.integers(0, 2, n) == 1).reshape(shape))
    if dtype in ("F8_E4M3", "F8_E5M2", "U8"):
        return Tensor(dtype, rng.integers(0, 256, n, dtype=np.uint8).reshape(shape))
    storage = DTYPES[dtype][1]
    info = np.iinfo(storage)
    arr = rng.integers(info.min, info.max, n, dtype=storage, endpoint=True)
    return Tensor(dtype, arr.reshape(shape))


def llama_like(seed=0, layers=2, hidden=16, inter=32, vocab=24, extras=True, dtype="F32"):
    """Small Llama-style state dict (q/k/v/gate/up split on dim 0, o/down on dim 1 by
    LLAMA_RULES) plus assorted dtypes and edge-case shapes."""
    rng = np.random.default_rng(seed)
    sd = collections.OrderedDict()

    def add(name, dt, shape, specials=True):
        sd[name] = random_tensor(rng, dt, shape, specials)

    add("model.embed_tokens.weight", dtype, (vocab, hidden))
    for i in range(layers):
        p = "model.layers.%d." % i
        # Mix floating dtypes across the layer so conversions see all three.
        dts = [dtype, "BF16", "F16"]
        add(p + "self_attn.q_proj.weight", dts[i % 3], (hidden, hidden))
        add(p + "self_attn.k_proj.weight", dts[(i + 1) % 3], (hidden, hidden))
        add(p + "self_attn.v_proj.weight", dts[(i + 2) % 3], (hidden, hidden))
        add(p + "self_attn.o_proj.weight", dtype, (hidden, hidden))
        add(p + "mlp.gate_proj.weight", dtype, (inter, hidden))
        add(p + "mlp.up_proj.weight", "BF16", (inter, hidden))
        add(p + "mlp.down_proj.weight", "F16", (hidden, inter))
        add(p + "input_layernorm.weight", dtype, (hidden,))
        add(p + "post_attention_layernorm.weight", dtype, (hidden,))
    add("model.norm.weight", dtype, (hidden,))
    add("lm_head.weight", dtype, (vocab, hidden))
    if extras:
        add("extra.f64", "F64", (5, 3))
        add("extra.i64", "I64", (9,))
        add("extra.i32", "I32", (2, 3, 4))
        add("extra.i16", "I16", (7,))
        add("extra.i8", "I8", (3, 5))
        add("extra.u8", "U8", (11,))
        add("extra.bool", "BOOL", (4, 4))
        add("extra.f8_e4m3", "F8_E4M3", (6, 2))
        add("extra.f8_e5m2", "F8_E5M2", (13,))
        add("extra.scalar_f32", "F32", ())
        add("extra.scalar_i64", "I64", ())
        add("extra.scalar_bf16", "BF16", ())
        add("extra.empty_f32", "F32", (0, 4))
        add("extra.empty_bf16", "BF16", (3, 0, 2))
        add("extra.empty_i32", "I32", (0,))
        add("extra.odd_f32", "F32", (7, 13, 3))
        add("extra.odd_f16", "F16", (7, 13, 3))
        add("extra.odd_bf16", "BF16", (13, 7))
        add("extra.ties_f32", "F32", (257,))
    return sd


def gpt_like(seed=1, layers=2, hidden=16, vocab=20):
    """Small GPT-2-style state dict (c_attn/c_fc split on dim 1, c_proj on dim 0 by GPT_RULES)."""
    rng = np.random.default_rng(seed)
    sd = collections.OrderedDict()

    def add(name, dt, shape):
        sd[name] = random_tensor(rng, dt, shape)

    add("transformer.wte.weight", "F32", (vocab, hidden))
    add("transformer.wpe.weight", "F32", (8, hidden))
    for i in range(layers):
        p = "transformer.h.%d." % i
        add(p + "ln_1.weight", "F32", (hidden,))
        add(p + "ln_1.bias", "F16", (hidden,))
        add(p + "attn.c_attn.weight", "F32", (hidden, 3 * hidden))
        add(p + "attn.c_attn.bias", "BF16", (3 * hidden,))
        add(p + "attn.c_proj.weight", "F16", (hidden, hidden))
        add(p + "attn.c_proj.bias", "F32", (hidden,))
        add(p + "attn.bias", "BOOL", (1, 1, 8, 8))
        add(p + "mlp.c_fc.weight", "BF16", (hidden, 4 * hidden))
        add(p + "mlp.c_fc.bias", "F32", (4 * hidden,))
        add(p + "mlp.c_proj.weight", "F32", (4 * hidden, hidden))
        add(p + "mlp.c_proj.bias", "F32", (hidden,))
    add("transformer.ln_f.weight", "F32", (hidden,))
    add("transformer.ln_f.bias", "F32", (hidden,))
    add("transformer.step", "I64", ())
    return sd


LLAMA_RULES = {"rules": [
    {"pattern": r"(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.weight$", "split_dim": 0},
    {"pattern": r"(o_proj|down_proj)\.weight$", "split_dim": -1},
    {"pattern": r"embed_tokens\.weight$", "split_dim": 1},
    {"pattern": r"lm_head\.weight$", "split_dim": 0},
    {"pattern": r".*", "replicate": True},
]}

GPT_RULES = {"rules": [
    {"pattern": r"(c_attn|c_fc)\.weight$", "split_dim": 1},
    {"pattern": r"(c_attn|c_fc)\.bias$", "split_dim": 0},
    {"pattern": r"c_proj\.weight$", "split_dim": 0},
    {"pattern": r".*", "replicate": True},
]}


def rule_for(rules, name):
    for r in rules["rules"]:
        if re.search(r["pattern"], name):
            return r
    raise KeyError(name)


def split_model(sd, rules, parts):
    """Reference model-parallel split: list of `parts` dicts."""
    out = [collections.OrderedDict() for _ in range(parts)]
    for name, t in sd.items():
        r = rule_for(rules, name)
        if r.get("replicate"):
            for p in out:
                p[name] = t
        else:
            d = r["split_dim"]
            pieces = np.split(t.array, parts, axis=d)
            for p, piece in zip(out, pieces):
                p[name] = Tensor(t.dtype, np.ascontiguousarray(piece))
    return out


def merge_parts(parts, rules):
    out = collections.OrderedDict()
    for name in parts[0]:
        r = rule_for(rules, name)
        if r.get("replicate"):
            out[name] = parts[0][name]
        else:
            out[name] = Tensor(parts[0][name].dtype,
                               np.concatenate([p[name].array for p in parts], axis=r["split_dim"]))
    return out
