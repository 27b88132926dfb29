"""Array-framework adapters: how hmla talks to PyTorch, CuPy, JAX and NumPy arrays.

The C++ extension takes every array as an ``nb::ndarray`` imported over DLPack. This module decides,
per array type, how to make the DLPack capsule (so that no framework inserts a stream
synchronisation of its own), which CUDA stream a call runs on, how outputs and the workspace are
allocated (with the caller's framework), and whether the call must wait before returning.

PyTorch  capsules from ``torch.utils.dlpack.to_dlpack`` (no stream handshake: hmla launches on the
         tensor's current stream, where PyTorch's own kernels run); stream =
         ``torch.cuda.current_stream(device)``; outputs ``torch.empty``. Asynchronous, graph-capturable.
         The decode calls take ``hmla._torch_fast`` instead when it was built and loads (``fast``):
         tensor metadata read in C++, outputs allocated with ATen, no DLPack (docs/PYTHON.md).
CuPy     ``__dlpack__(stream=...)`` with CuPy's current stream; stream =
         ``cupy.cuda.get_current_stream()``; outputs ``cupy.empty``. Asynchronous.
JAX      ``__dlpack__(stream=1)``: JAX makes the CUDA legacy default stream wait for the arrays; hmla runs
         on that stream and synchronises it before returning (JAX has no notion of a "current
         stream" and its arrays are immutable, so the call is synchronous). Outputs ``jnp.empty``.
         Not usable inside ``jax.jit`` (tracers are rejected with a TypeError).
NumPy    host arrays: accepted only by the host helpers; the attention functions reject them with a
         ValueError naming the argument.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import _C

_LEGACY_STREAM_DLPACK = 1  # the DLPack spec's code for CUDA's legacy default stream


class Adapter:
    name = "?"
    host = False  # arrays live in host memory
    synchronous = False  # finish() must run after the launches
    fast: Any = None  # hmla._torch_fast for PyTorch, when built for the PyTorch in use

    def alloc_outputs(self, like: Any, out_shape, lse_shape):
        """(out with like's dtype, lse float32), on like's device."""
        return self.empty(out_shape, like), self.empty_f32(lse_shape, like)

    def dl(self, x: Any) -> Any:  # a DLPack capsule (or an object nanobind can import)
        raise NotImplementedError

    def stream(self, x: Any) -> int:
        return 0

    def device_index(self, x: Any) -> Optional[int]:
        return None

    def empty(self, shape, like: Any) -> Any:  # dtype of `like`
        raise NotImplementedError

    def empty_f32(self, shape, like: Any) -> Any:
        raise NotImplementedError

    def empty_bytes(self, nbytes: int, like: Any) -> Any:
        raise NotImplementedError

    def dtype_name(self, x: Any) -> str:
        return str(getattr(x, "dtype", "?"))

    def finish(self, stream: int, like: Any) -> None:
        """Called after the launches of one call (JAX: wait for them)."""

    def as_bytes(self, x: Any) -> Any:
        """The same memory viewed as uint8 when the element size is 1 (FP8 caches)."""
        return x


class TorchAdapter(Adapter):
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        import torch.utils.dlpack as tdl

        self._to_dlpack = tdl.to_dlpack
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw
        self._uint8 = torch.uint8
        self._float32 = torch.float32
        self.tensor_type = torch.Tensor
        self.fast = _load_torch_fast()

    def dl(self, x):
        return self._to_dlpack(x)

    def stream(self, x):
        dev = x.get_device()
        if self._raw_stream is not None:
            return self._raw_stream(dev)
        return self.torch.cuda.current_stream(dev).cuda_stream

    def device_index(self, x):
        return x.get_device() if x.is_cuda else None

    def alloc_outputs(self, like, out_shape, lse_shape):
        return like.new_empty(out_shape), like.new_empty(lse_shape, dtype=self._float32)

    def empty(self, shape, like):
        return self.torch.empty(shape, dtype=like.dtype, device=like.device)

    def empty_f32(self, shape, like):
        return self.torch.empty(shape, dtype=self._float32, device=like.device)

    def empty_bytes(self, nbytes, like):
        return self.torch.empty((nbytes,), dtype=self._uint8, device=like.device)

    def dtype_name(self, x):
        return str(x.dtype).replace("torch.", "")

    def as_bytes(self, x):
        if x.element_size() == 1 and x.dtype not in (self.torch.uint8, self.torch.int8):
            return x.view(self._uint8)
        return x


def _load_torch_fast() -> Any:
    """hmla._torch_fast, or None where it was not built or does not load with this PyTorch (built
    against another one: the DLPack path then serves, with the same results). HMLA_TORCH_FAST=0
    turns it off."""
    import os

    if os.environ.get("HMLA_TORCH_FAST", "1") == "0":
        return None
    try:
        from . import _torch_fast
    except (ImportError, OSError):
        return None
    return _torch_fast


class CupyAdapter(Adapter):
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self._mode = 0  # 0: __dlpack__(stream=-1), 1: __dlpack__(stream=s), 2: toDlpack()

    def stream(self, x):
        with x.device:
            return self.cupy.cuda.get_current_stream().ptr

    def dl(self, x):
        mode = self._mode
        if mode == 0:
            try:
                return x.__dlpack__(stream=-1)  # same stream as the producer: no handshake
            except Exception:
                self._mode = mode = 1
        if mode == 1:
            try:
                s = self.stream(x)
                return x.__dlpack__(stream=s if s else _LEGACY_STREAM_DLPACK)
            except Exception:
                self._mode = mode = 2
        return x.toDlpack()

    def device_index(self, x):
        return x.device.id

    def empty(self, shape, like):
        with like.device:
            return self.cupy.empty(shape, dtype=like.dtype)

    def empty_f32(self, shape, like):
        with like.device:
            return self.cupy.empty(shape, dtype=self.cupy.float32)

    def empty_bytes(self, nbytes, like):
        with like.device:
            return self.cupy.empty((nbytes,), dtype=self.cupy.uint8)

    def as_bytes(self, x):
        if x.dtype.itemsize == 1 and x.dtype.kind not in "iu":
            return x.view(self.cupy.uint8)
        return x


class JaxAdapter(Adapter):
    name = "jax"
    synchronous = True

    def __init__(self, jax: Any) -> None:
        self.jax = jax
        import jax.numpy as jnp

        self.jnp = jnp

    def _device(self, x):
        devs = x.devices() if callable(getattr(x, "devices", None)) else {x.device}
        return next(iter(devs))

    def dl(self, x):
        try:
            return x.__dlpack__(stream=_LEGACY_STREAM_DLPACK)  # JAX orders the legacy stream after x
        except Exception:
            self.jax.block_until_ready(x)
            return x.__dlpack__()

    def stream(self, x):
        return 0  # the legacy default stream, synchronised in finish()

    def device_index(self, x):
        d = self._device(x)
        if getattr(d, "platform", "") != "gpu" and getattr(d, "platform", "") != "cuda":
            return None
        hw = getattr(d, "local_hardware_id", None)
        return hw if hw is not None else getattr(d, "id", 0)

    def _empty(self, shape, dtype, like):
        dev = self._device(like)
        try:
            return self.jnp.empty(shape, dtype=dtype, device=dev)
        except TypeError:  # jax without the device= keyword
            return self.jax.device_put(self.jnp.empty(shape, dtype=dtype), dev)

    def empty(self, shape, like):
        return self._empty(shape, like.dtype, like)

    def empty_f32(self, shape, like):
        return self._empty(shape, self.jnp.float32, like)

    def empty_bytes(self, nbytes, like):
        return self._empty((nbytes,), self.jnp.uint8, like)

    def finish(self, stream, like):
        _C.stream_synchronize(stream, self.device_index(like))

    def as_bytes(self, x):
        if x.dtype.itemsize == 1 and x.dtype.kind not in "iu":
            return self.jax.lax.bitcast_convert_type(x, self.jnp.uint8)
        return x


class NumpyAdapter(Adapter):
    name = "numpy"
    host = True

    def dl(self, x):
        return x

    def as_bytes(self, x):
        import numpy as np

        if x.dtype.itemsize == 1 and x.dtype.kind not in "iu":
            return x.view(np.uint8)
        return x


class GenericAdapter(Adapter):
    """Any other object with __dlpack__: legacy default stream, synchronous."""

    name = "dlpack"
    synchronous = True

    def dl(self, x):
        return x.__dlpack__(stream=_LEGACY_STREAM_DLPACK)

    def finish(self, stream, like):
        _C.stream_synchronize(stream, -1)


_BY_TYPE: Dict[type, Adapter] = {}
_SINGLETONS: Dict[str, Adapter] = {}


def _singleton(name: str) -> Adapter:
    a = _SINGLETONS.get(name)
    if a is None:
        if name == "torch":
            import torch

            a = TorchAdapter(torch)
        elif name == "cupy":
            import cupy

            a = CupyAdapter(cupy)
        elif name == "jax":
            import jax

            a = JaxAdapter(jax)
        elif name == "numpy":
            a = NumpyAdapter()
        else:
            a = GenericAdapter()
        _SINGLETONS[name] = a
    return a


def _is_jax_tracer(x: Any) -> bool:
    try:
        import jax

        return isinstance(x, jax.core.Tracer)
    except Exception:
        return False


def adapter_for(x: Any, fn: str, arg: str) -> Adapter:
    """The adapter of x's framework; TypeError naming the argument for anything else."""
    a = _BY_TYPE.get(type(x))
    if a is not None:
        return a
    if x is None:
        raise TypeError(f"hmla.{fn}: argument '{arg}' is None, expected an array")
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):
        a = _singleton("torch")
    elif mod.startswith("cupy"):
        a = _singleton("cupy")
    elif mod.startswith(("jax", "jaxlib")):
        if _is_jax_tracer(x):
            raise TypeError(
                f"hmla.{fn}: argument '{arg}' is a JAX tracer: hmla functions run eagerly on concrete "
                "arrays and cannot be called inside jax.jit, vmap or grad"
            )
        a = _singleton("jax")
    elif mod.startswith("numpy"):
        a = _singleton("numpy")
    elif hasattr(x, "__dlpack__"):
        a = _singleton("dlpack")
    else:
        raise TypeError(
            f"hmla.{fn}: argument '{arg}' has type {type(x).__module__}.{type(x).__qualname__}, "
            "expected a PyTorch tensor, CuPy array, JAX array or another DLPack array"
        )
    _BY_TYPE[type(x)] = a
    return a


def export(x: Any, fw: Adapter, fn: str, arg: str) -> Any:
    """DLPack capsule of x, through its own framework's adapter; TypeError naming the argument."""
    a = fw if type(x) in _BY_TYPE and _BY_TYPE[type(x)] is fw else adapter_for(x, fn, arg)
    try:
        return a.dl(x)
    except Exception as e:  # the framework refused the export (unsupported dtype, ...)
        raise TypeError(f"hmla.{fn}: argument '{arg}' could not be exported over DLPack: {e}") from e
