"""A module skipped as a whole at import, as GPU-only modules do."""

import pytest

pytest.skip("module needs CUDA", allow_module_level=True)


def test_never_runs():
    pass
