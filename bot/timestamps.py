"""GitHub's ISO 8601 timestamps (`2019-05-15T15:20:21Z`) to and from epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime


def epoch(timestamp: object) -> float | None:
    """Epoch seconds of a GitHub timestamp; None when absent or unreadable."""
    if not isinstance(timestamp, str):
        return None
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return None


def iso(seconds: float) -> str:
    """The GitHub form of epoch seconds, in UTC."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
