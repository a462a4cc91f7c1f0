"""A test skipped for a missing tool is named again, loudly, at the end of the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SUITE = """
from tests.missing_tools import skip_missing
import pytest

def test_needs_a_browser():
    skip_missing("Chromium is not installed: apt-get install -y chromium")

def test_needs_a_gpu():
    pytest.skip("needs a CUDA GPU")

def test_runs():
    pass
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_missing_tool_is_repeated_at_the_end(tmp_path: Path, xdist: list[str]) -> None:
    (tmp_path / "test_tools.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "tests.missing_tools",
        "-p",
        "no:cacheprovider",
        "-ra",
    ]
    done = subprocess.run(
        [*args, *xdist, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    banner = done.stdout.index("NOT TESTED: 1 test(s) skipped for a missing tool")
    end = done.stdout[banner:]
    assert "test_tools.py::test_needs_a_browser: Chromium is not installed: apt-get install" in end
    assert "needs a CUDA GPU" not in end  # an ordinary skip is not a missing tool
    assert banner > done.stdout.index(" passed, 2 skipped")  # after pytest's last line
