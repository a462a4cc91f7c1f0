"""The run after a hostile one: a clean environment, and its failing test fails."""

import importlib.util
import sys
from pathlib import Path


def test_the_environment_is_clean():
    assert importlib.util.find_spec("gpuci_evil") is None
    assert not list(Path(sys.prefix).rglob("gpuci_evil*"))
    import basepkg

    assert basepkg.__version__ == "1.0"


def test_fails_as_written():
    raise AssertionError("this test fails")
