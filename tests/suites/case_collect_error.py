"""A module that fails to import: a collection error."""

import gpuci_no_such_module  # noqa: F401


def test_never_collected():
    pass
