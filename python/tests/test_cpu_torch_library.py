"""CPU tests of hmla's torch.library registration (hmla/_torch_library.py): without PyTorch the package
imports and registers nothing; with PyTorch the fake implementations, run under FakeTensorMode (no
GPU), give the shapes, dtypes and layouts of the eager call's outputs and name a bad argument."""

import importlib.util
import sys

import pytest

import hmla

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(HAVE_TORCH, reason="PyTorch is installed: this test is for machines without it")
def test_without_torch_nothing_is_registered():
    assert "torch" not in sys.modules, "import hmla must not need PyTorch"
    assert "hmla._torch_library" not in sys.modules
    assert hmla._interface._torch_compile.is_compiling() is False


def _torch_with_ops():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.library, "custom_op"):
        pytest.skip(f"PyTorch {torch.__version__} has no torch.library.custom_op (2.4 or later registers hmla's ops)")
    return torch


def test_ops_are_registered_with_the_workspace_mutable():
    torch = _torch_with_ops()
    assert hmla._interface._torch_compile is sys.modules["hmla._torch_library"]
    for name in ("dense_decode_plan", "dense_decode_run", "sparse_decode_plan", "sparse_decode_run"):
        schema = getattr(torch.ops.hmla, name).default._schema
        mutable = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert mutable == ["workspace"], (name, str(schema))


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_dense_fake_outputs_are_the_eager_ones(dtype_name):
    torch = _torch_with_ops()
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = getattr(torch, dtype_name)
    b, s_q, h_q, h_kv = 3, 2, 64, 2
    with FakeTensorMode():
        q = torch.empty(b, s_q, h_q, 576, dtype=dtype)
        k = torch.empty(10, 64, h_kv, 576, dtype=dtype)
        bt = torch.empty(b, 4, dtype=torch.int32)
        sl = torch.empty(b, dtype=torch.int32)
        ws = torch.empty(4096, dtype=torch.uint8)
        assert torch.ops.hmla.dense_decode_plan(sl, ws, s_q, h_q, h_kv) is None
        out, lse = torch.ops.hmla.dense_decode_run(q, k, bt, sl, ws, 0.1, True)
        assert out.shape == (b, s_q, h_q, 512) and out.dtype == dtype and out.is_contiguous()
        assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32 and lse.is_contiguous()
        assert out.device == q.device and lse.device == q.device
        with pytest.raises(ValueError, match="argument 'q' has 3 dimensions, expected 4"):
            torch.ops.hmla.dense_decode_run(q[0], k, bt, sl, ws, 0.1, True)


@pytest.mark.parametrize("d_qk, bytes_per_token", [(576, 656), (512, 584)])
@pytest.mark.parametrize("with_options", [False, True])
def test_sparse_fake_outputs_are_the_eager_ones(d_qk, bytes_per_token, with_options):
    torch = _torch_with_ops()
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, s_q, h_q, topk, extra_topk = 2, 3, 100, 128, 64
    with FakeTensorMode():
        q = torch.empty(b, s_q, h_q, d_qk, dtype=torch.bfloat16)
        k = torch.empty(4, 64, 1, bytes_per_token, dtype=torch.float8_e4m3fn)
        idx = torch.empty(b, s_q, topk, dtype=torch.int32)
        ws = torch.empty(4096, dtype=torch.uint8)
        options = (None, None, None, None, None)
        if with_options:
            options = (torch.empty(b, dtype=torch.int32), torch.empty(h_q, dtype=torch.float32),
                       torch.empty(40, 2, 1, bytes_per_token, dtype=torch.float8_e4m3fn),
                       torch.empty(b, s_q, extra_topk, dtype=torch.int32), torch.empty(b, dtype=torch.int32))
        topk_length, sink, extra_k, extra_idx, extra_topk_length = options
        assert torch.ops.hmla.sparse_decode_plan(ws, topk_length, extra_topk_length, b, s_q, h_q, topk,
                                                 with_options, extra_topk if with_options else 0) is None
        out, lse = torch.ops.hmla.sparse_decode_run(q, k, idx, topk_length, sink, extra_k, extra_idx,
                                                    extra_topk_length, ws, 0.05)
        assert out.shape == (b, s_q, h_q, 512) and out.dtype == torch.bfloat16 and out.is_contiguous()
        assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32 and lse.is_contiguous()
