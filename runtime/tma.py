"""Tensor maps for Hopper's TMA (lesson 12): the 128 bytes that describe a 2-D tensor and the
box (tile) one TMA copy moves, for kernels that include ``kernels/cuda/hopper.h``.

    tensor_map(t, box_rows, box_cols, swizzle=128)   a uint8 tensor of 128 bytes on t's device

Pass the result where the kernel takes a ``const TmaDescriptor*``. On a GPU the driver encodes
it (``cuTensorMapEncodeTiled``); in simulation the emulator's own encoding of the same facts
(the tensor's address, sizes and row stride, the box, the swizzle) goes into the 128 bytes. The
same rules hold in both modes, checked here with a clear message (the driver would only say
CUDA_ERROR_INVALID_VALUE):

* ``t`` is 2-D, of a 1-, 2-, 4- or 8-byte dtype, its rows contiguous (stride 1 along columns),
  its address 16-byte aligned and its row stride a multiple of 16 bytes;
* a box is 1..256 elements on each side, and its rows (``box_cols`` elements) are a multiple
  of 16 bytes;
* with a swizzle (32, 64 or 128 bytes), a box row is at most that many bytes.

Maps are cached by everything they encode, so a launcher may ask for one on every call.
"""
from __future__ import annotations

import ctypes
import struct
from collections import OrderedDict

import torch

from .config import SIMULATE

__all__ = ["tensor_map", "SWIZZLES"]

#: bytes of a swizzle -> the CUtensorMapSwizzle number (hopper.h's TmaSwizzle)
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}
_DTYPES = {torch.uint8: 0, torch.int8: 0, torch.uint16: 1, torch.int16: 1, torch.float16: 6, torch.bfloat16: 9,
           torch.float32: 7, torch.int32: 3, torch.uint32: 2, torch.float64: 8, torch.int64: 5, torch.uint64: 4}
_MAGIC = 0x414D5443  # "CTMA", hopper_emu.h's kMapMagic
_LAYOUT = "<IIQQQIIIIQ"  # hopper_emu.h's MapData: magic, element size, dims, row bytes, box, swizzle, pad, base
#: where the tensor's address lies in an emulator map (the emulator's launch moves it, see
#: emulated_map_base)
EMULATOR_BASE_OFFSET = struct.calcsize(_LAYOUT) - 8
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 256
_ENCODE = None


def _check(t, box_rows: int, box_cols: int, swizzle: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor_map: t must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"tensor_map: t must be 2-D (rows, columns), got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"tensor_map: TMA moves 1-, 2-, 4- or 8-byte elements; {t.dtype} is not one of the dtypes "
                        f"it knows")
    if swizzle not in SWIZZLES:
        raise ValueError(f"tensor_map: swizzle is 0 (none), 32, 64 or 128 bytes, got {swizzle!r}")
    for name, v in (("box_rows", box_rows), ("box_cols", box_cols)):
        if not isinstance(v, int) or not 1 <= v <= 256:
            raise ValueError(f"tensor_map: {name} must be an int from 1 to 256 (a TMA box is at most 256 on a side), "
                             f"got {v!r}")
    e = t.element_size()
    if box_cols * e % 16:
        raise ValueError(f"tensor_map: a box row of {box_cols} elements is {box_cols * e} bytes; TMA moves rows of a "
                         f"multiple of 16 bytes")
    if swizzle and box_cols * e > swizzle:
        raise ValueError(f"tensor_map: with a {swizzle}-byte swizzle a box row is at most {swizzle} bytes "
                         f"({swizzle // e} elements of {t.dtype}), got {box_cols} elements ({box_cols * e} bytes)")
    if t.numel() and t.stride(1) != 1:
        raise ValueError("tensor_map: the rows of t must be contiguous (stride 1 along the columns): pass "
                         "t.contiguous()")
    if t.data_ptr() % 16:
        raise ValueError(f"tensor_map: TMA needs a 16-byte aligned address; t starts {t.data_ptr() % 16} bytes past "
                         f"one (a view into the middle of a tensor?): pass t.clone()")
    if t.shape[0] > 1 and t.stride(0) * e % 16:
        raise ValueError(f"tensor_map: the row stride of t is {t.stride(0) * e} bytes; TMA needs a multiple of 16 "
                         f"(pad each row to a multiple of {16 // e} elements)")
    if t.numel() == 0:
        raise ValueError(f"tensor_map: t is empty (shape {tuple(t.shape)}): there is nothing to map")


def _encode_emulator(t, box_rows: int, box_cols: int, swizzle: int) -> bytes:
    e = t.element_size()
    row_bytes = t.stride(0) * e if t.shape[0] > 1 else t.shape[1] * e
    data = struct.pack(_LAYOUT, _MAGIC, e, t.shape[1], t.shape[0], row_bytes, box_cols, box_rows,
                       SWIZZLES[swizzle], 0, t.data_ptr())
    return data.ljust(128, b"\0")


def emulated_map_base(address: int) -> int | None:
    """The address of the tensor an emulator map at ``address`` (its 128 bytes in the host's
    memory) describes, or None when those bytes are not such a map."""
    if ctypes.c_uint32.from_address(address).value != _MAGIC:
        return None
    return ctypes.c_uint64.from_address(address + EMULATOR_BASE_OFFSET).value


def _encoder():
    global _ENCODE
    if _ENCODE is None:
        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cuTensorMapEncodeTiled
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        f.restype = ctypes.c_int
        _ENCODE = f
    return _ENCODE


def _encode_gpu(t, box_rows: int, box_cols: int, swizzle: int) -> bytes:
    e = t.element_size()
    buf = (ctypes.c_uint8 * 128)()
    dims = (ctypes.c_uint64 * 2)(t.shape[1], t.shape[0])
    strides = (ctypes.c_uint64 * 1)(t.stride(0) * e if t.shape[0] > 1 else t.shape[1] * e)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    ones = (ctypes.c_uint32 * 2)(1, 1)
    # interleave none, the swizzle, L2 promotion of 256 bytes, out-of-bounds elements read as zeros
    rc = _encoder()(buf, _DTYPES[t.dtype], 2, ctypes.c_void_p(t.data_ptr()), dims, strides, box, ones, 0,
                    SWIZZLES[swizzle], 3, 0)
    if rc:
        raise RuntimeError(f"tensor_map: cuTensorMapEncodeTiled failed with CUresult {rc} for a {tuple(t.shape)} "
                           f"{t.dtype} tensor, box {box_rows} x {box_cols}, swizzle {swizzle}")
    return bytes(buf)


def tensor_map(t: torch.Tensor, box_rows: int, box_cols: int, swizzle: int = 128) -> torch.Tensor:
    """The TMA tensor map of the 2-D tensor ``t`` for boxes of ``box_rows`` x ``box_cols``
    elements written to shared memory with a ``swizzle``-byte swizzle (0 for none): 128 bytes
    as a uint8 tensor on ``t``'s device, for a kernel's ``const TmaDescriptor*`` argument.
    Out-of-bounds parts of a box load as zeros (and are not written by a store).

    The map holds ``t``'s address, not ``t``: keep ``t`` alive while a kernel uses the map."""
    _check(t, box_rows, box_cols, swizzle)
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device, box_rows, box_cols, swizzle)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    on_gpu = t.is_cuda and not SIMULATE
    data = (_encode_gpu if on_gpu else _encode_emulator)(t, box_rows, box_cols, swizzle)
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = host.to(t.device) if t.device.type != "cpu" else host.clone()
    _CACHE[key] = out
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out
