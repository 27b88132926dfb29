"""A minimal DLPack producer for the CPU tests: wraps a NumPy buffer as a DLPack capsule with any
dtype code (e.g. bfloat16, which NumPy cannot export) and any device type.

Only for argument-checking tests: hmla imports the capsule and checks its metadata; nothing
dereferences the data pointer when the checks are expected to fail, or with require_cuda=False.
"""

import ctypes

import numpy as np

BFLOAT = 4
FLOAT = 2
INT = 0
UINT = 1
FLOAT8_E4M3FN = 10
CPU = 1
CUDA = 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_keep = []  # keeps the structs and buffers alive for the whole test session


class FakeArray:
    """An object with __dlpack__ whose capsule describes `buf` as (code, bits) on `device_type`."""

    def __init__(self, shape, code, bits, device_type=CPU, device_id=0, strides=None):
        shape = tuple(int(s) for s in shape)
        itemsize = max(1, bits // 8)
        n = int(np.prod(shape)) if shape else 1
        if strides is None:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.append(acc)
                acc *= s
            strides = tuple(reversed(strides))
        span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if n else 1
        self.buf = np.zeros(max(span, 1) * itemsize + 256, dtype=np.uint8)
        base = self.buf.ctypes.data
        aligned = (base + 255) // 256 * 256  # 256-byte aligned, as cudaMalloc
        self.shape = shape
        self.code, self.bits, self.device_type, self.device_id = code, bits, device_type, device_id
        self._strides = tuple(strides)
        self._data = aligned

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        nd = len(self.shape)
        shape = (ctypes.c_int64 * max(nd, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(nd, 1))(*self._strides)
        mt = _DLManagedTensor()
        mt.dl_tensor.data = self._data
        mt.dl_tensor.device = _DLDevice(self.device_type, self.device_id)
        mt.dl_tensor.ndim = nd
        mt.dl_tensor.dtype = _DLDataType(self.code, self.bits, 1)
        mt.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        mt.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        mt.dl_tensor.byte_offset = 0
        mt.manager_ctx = None
        mt.deleter = None
        _keep.append((mt, shape, strides, self.buf))
        return _PyCapsule_New(ctypes.addressof(mt), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)


def bf16(shape, **kw):
    return FakeArray(shape, BFLOAT, 16, **kw)


def f16(shape, **kw):
    return FakeArray(shape, FLOAT, 16, **kw)


def f32(shape, **kw):
    return FakeArray(shape, FLOAT, 32, **kw)


def i32(shape, **kw):
    return FakeArray(shape, INT, 32, **kw)


def u8(shape, **kw):
    return FakeArray(shape, UINT, 8, **kw)
