"""Fetching a run's source archive at its SHA through fakehub, with a repo-scoped token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakehub.testing import Running, running
from fakehub.world import load_world
from tests.test_fakehub import WORLD, new_token
from workers.archive import extract_archive
from workers.source import SourceError, cached_archive, fetch_archive


@pytest.fixture
def hub() -> Iterator[Running]:
    with running(load_world(WORLD)) as found:
        yield found


def pr_head(hub: Running, number: int) -> str:
    sha: str = hub.world.pulls[("acme/sample", number)].head_sha
    return sha


def test_archive_at_sha_is_fetched_once_and_extracts(hub: Running, tmp_path: Path) -> None:
    token = new_token(hub, repositories=["sample"], permissions={"contents": "read"})
    sha = pr_head(hub, 1)
    archive = fetch_archive(hub.url, "acme/sample", sha, token, tmp_path / "cache")
    assert archive == cached_archive(tmp_path / "cache", "acme/sample", sha)
    src = extract_archive(archive, tmp_path / "src")
    assert (src / "tests" / "test_math.py").read_text().endswith("assert 2 + 2 == 4\n")
    # cached: a second fetch needs no valid token at all
    assert fetch_archive(hub.url, "acme/sample", sha, "not-a-token", tmp_path / "cache") == archive


@pytest.mark.parametrize(
    ("repo", "sha", "message"),
    [
        ("acme/sample", "main", "40 hex"),
        ("acme/sample", "A" * 40, "40 hex"),
        ("acme/sample;rm", "a" * 40, "owner/name"),
        ("../etc", "a" * 40, "owner/name"),  # path-check: hostile input
    ],
)
def test_refuses_anything_but_a_sha_and_a_repo(
    hub: Running, tmp_path: Path, repo: str, sha: str, message: str
) -> None:
    with pytest.raises(SourceError, match=message):
        fetch_archive(hub.url, repo, sha, "t", tmp_path)


def test_bad_token_is_a_clear_error_and_caches_nothing(hub: Running, tmp_path: Path) -> None:
    sha = pr_head(hub, 1)
    with pytest.raises(SourceError, match="HTTP 401"):
        fetch_archive(hub.url, "acme/sample", sha, "ghs_forged", tmp_path)
    assert not cached_archive(tmp_path, "acme/sample", sha).exists()
    assert not list(tmp_path.rglob("*.part"))


def test_unknown_sha_is_404(hub: Running, tmp_path: Path) -> None:
    token = new_token(hub)
    with pytest.raises(SourceError, match="HTTP 404"):
        fetch_archive(hub.url, "acme/sample", "0" * 40, token, tmp_path)


def test_unreachable_api_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="could not download"):
        fetch_archive("http://127.0.0.1:1", "acme/sample", "a" * 40, "t", tmp_path)
