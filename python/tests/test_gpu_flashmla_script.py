"""A script written for FlashMLA runs unchanged with ``import hmla as flash_mla``."""

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


def test_flashmla_script_runs_unchanged(torch_cuda):
    script = os.path.join(HERE, "flashmla_style_script.py")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed hmla, as a user has it
    r = subprocess.run([sys.executable, "-c", RUNNER, script], capture_output=True, text=True, env=env,
                       cwd=HERE, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("OK"), r.stdout + r.stderr
