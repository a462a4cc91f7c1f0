"""Every Redis key gpuci uses is built here, so the data model reads in one file."""

from __future__ import annotations

PREFIX = "gpuci"


def gpu_lease(host: str, index: int) -> str:
    """String: the owner token of the run holding GPU `index` on `host`; expires (TTL)."""
    return f"{PREFIX}:lease:{host}:{index}"


def delivery(delivery_id: str) -> str:
    """String: present while a webhook delivery id counts as seen (dedupe, 7 days)."""
    return f"{PREFIX}:delivery:{delivery_id}"
