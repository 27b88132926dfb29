"""Scripts written for FlashMLA (dense decode; sparse decode over FP8 caches) run unchanged with
``import hmla as flash_mla``."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))

RUNNER = (
    "import runpy, sys, hmla\n"
    "sys.modules['flash_mla'] = hmla  # the one change: hmla answers to the name flash_mla\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


@pytest.mark.parametrize("name", ["flashmla_style_script.py", "flashmla_style_sparse_script.py"])
def test_flashmla_script_runs_unchanged(torch_cuda, name):
    script = os.path.join(HERE, name)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed hmla, as a user has it
    r = subprocess.run([sys.executable, "-c", RUNNER, script], capture_output=True, text=True, env=env,
                       cwd=HERE, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("OK"), r.stdout + r.stderr
