"""The library type-checks: `mypy` with the configuration in pyproject.toml ([tool.mypy]: strict, over freshroute/)
finds nothing."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the `test` extra: pip install -e '.[test]')")
def test_the_library_type_checks_under_strict_mypy():
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, f"mypy exited {run.returncode}:\n{run.stdout}{run.stderr}"
