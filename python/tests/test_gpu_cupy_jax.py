"""GPU tests with CuPy and JAX arrays: one dense decode call each, outputs in the caller's framework,
compared with the PyTorch float32 reference."""

import numpy as np
import pytest

import hmla
from gpu_ref import assert_close, make_case, reference

pytestmark = pytest.mark.gpu


def test_cupy_call(torch_cuda):
    torch = torch_cuda
    cupy = pytest.importorskip("cupy")
    # CuPy has no bfloat16: fp16, which hmla supports as well.
    q, k, bt, sl = make_case(torch, 3, 2, 32, 1, [5, 700, 2100], dtype=torch.float16)
    torch.cuda.synchronize()
    cq, ck, cbt, csl = (cupy.from_dlpack(t) for t in (q, k, bt, sl))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        meta, _ = hmla.get_mla_metadata()
        out, lse = hmla.flash_mla_with_kvcache(cq, ck, cbt, csl, 512, meta, causal=True)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert out.dtype == cupy.float16 and lse.dtype == cupy.float32
    assert isinstance(meta.workspace, cupy.ndarray)
    ref_out, ref_lse = reference(torch, q, k, bt, sl, True)
    assert_close(torch, torch.from_dlpack(out), torch.from_dlpack(lse), ref_out, ref_lse, torch.float16)


def test_jax_call(torch_cuda):
    torch = torch_cuda
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX has no GPU backend here (jax[cuda] not installed)")
    q, k, bt, sl = make_case(torch, 2, 1, 16, 1, [300, 4000])
    torch.cuda.synchronize()

    def to_jax(t):
        if t.dtype == torch.bfloat16:  # through host memory: independent of JAX's DLPack import rules
            return jax.device_put(t.view(torch.int16).cpu().numpy().view(jnp.bfloat16), gpus[0])
        return jax.device_put(jnp.asarray(t.cpu().numpy()), gpus[0])

    jq, jk, jbt, jsl = (to_jax(t) for t in (q, k, bt, sl))
    meta, _ = hmla.get_mla_metadata()
    out, lse = hmla.flash_mla_with_kvcache(jq, jk, jbt, jsl, 512, meta)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 1, 16, 512) and lse.shape == (2, 16, 1)
    out_t = torch.from_numpy(np.asarray(out).view(np.int16).copy()).view(torch.bfloat16).cuda()
    lse_t = torch.from_numpy(np.asarray(lse)).cuda()
    ref_out, ref_lse = reference(torch, q, k, bt, sl, False)
    assert_close(torch, out_t, lse_t, ref_out, ref_lse, torch.bfloat16)
    # JAX keeps working with the outputs
    assert np.isfinite(float(jnp.sum(out.astype(jnp.float32))))
    with pytest.raises(TypeError, match="JAX tracer"):
        jax.jit(lambda a: hmla.flash_mla_with_kvcache(a, jk, jbt, jsl, 512, hmla.get_mla_metadata()[0])[0])(jq)
