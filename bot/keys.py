"""Every Redis key gpuci uses is built here, so the data model reads in one file."""

from __future__ import annotations

PREFIX = "gpuci"


def gpu_lease(host: str, index: int) -> str:
    """String: the owner token of the run holding GPU `index` on `host`; expires (TTL)."""
    return f"{PREFIX}:lease:{host}:{index}"
