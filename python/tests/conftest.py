"""Shared fixtures of hmla's Python tests.

Tests marked ``gpu`` need a Hopper GPU and PyTorch with CUDA; elsewhere they are skipped with a
message saying why. Everything else runs on any machine (CPU-only CI included).
"""

import os

# JAX must not grab most of the GPU memory in a process that also runs PyTorch.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper (sm_90) GPU and PyTorch with CUDA")


def pytest_report_header(config):
    try:
        import hmla

        return [f"hmla: {hmla.__file__} (CUDA devices seen by the extension: {hmla.cuda_device_count()})"]
    except Exception as e:  # pragma: no cover - reported, the import test fails properly
        return [f"hmla: import failed: {e!r}"]


def _gpu_skip_reason():
    try:
        import torch
    except Exception:
        return "PyTorch is not installed (the GPU tests use it for inputs and the float32 reference)"
    if not torch.cuda.is_available():
        return "no CUDA GPU available"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"hmla's kernels need a Hopper GPU (sm_90); this GPU is sm_{major}{minor}"
    return None


_REASON = _gpu_skip_reason()


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test skipped: {_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def torch_cuda():
    import torch

    torch.manual_seed(0)
    return torch
