"""safetensors read by the independent reader (st_reference.py), as torch tensors: what the
PyTorch interop suites compare reshard's outputs with. Needs torch (Debian python3-torch)."""

import collections

import numpy as np
import torch

import st_reference

TORCH_OF = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
TAG_OF = {v: k for k, v in TORCH_OF.items()}


def tensor_from_st(t):
    """One st_reference tensor as a torch tensor of the same dtype, shape and bytes."""
    raw = t.raw()
    dtype = TORCH_OF[t.dtype]
    if len(raw) == 0:
        return torch.empty(tuple(t.shape), dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(tuple(t.shape))


def read_file(path):
    """A safetensors file as an OrderedDict name -> torch tensor, in file order."""
    return collections.OrderedDict(
        (name, tensor_from_st(t)) for name, t in st_reference.read_file(path).items())


def read_folder(folder):
    """A consolidated folder (one file, or shards with an index) as name -> torch tensor."""
    return collections.OrderedDict(
        (name, tensor_from_st(t)) for name, t in st_reference.read_folder(folder).items())


def write_file(path, tensors, metadata=None):
    """safetensors.torch.save_file through st_reference: name -> torch tensor (any strides).
    `metadata` None writes {"format": "pt"}, {} writes no __metadata__."""
    out = {}
    for name, t in tensors.items():
        t = t.contiguous()
        tag = TAG_OF[t.dtype]
        arr = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        # st_reference.make_tensor would make a 0-d tensor 1-d (np.ascontiguousarray does).
        out[name] = st_reference.Tensor(tag, np.asarray(arr, dtype=st_reference.DTYPES[tag][1]))
    st_reference.write_file(path, out, metadata)
