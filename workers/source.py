"""The source archive of a run: fetched through the GitHub API at the run's SHA, cached per SHA."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import requests

from contract.redact import redact_text

MAX_ARCHIVE_BYTES = 2 * 1024**3
CHUNK = 1024 * 1024
_SHA = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"(?!\.+/)[A-Za-z0-9_.-]+/(?!\.+$)[A-Za-z0-9_.-]+")


class SourceError(Exception):
    """The archive could not be fetched; the message names the repository, SHA and cause."""


def cached_archive(cache_dir: Path, repo: str, sha: str) -> Path:
    """Where the archive of `repo` at `sha` is kept on this host."""
    return cache_dir / repo.replace("/", "__") / f"{sha}.tar.gz"


def fetch_archive(api_url: str, repo: str, sha: str, token: str, cache_dir: Path) -> Path:
    """The tarball of `repo` at exactly `sha`, downloaded once per SHA (atomic, size-capped).

    The token is sent to the API only; GitHub's redirect to its download host carries its own
    signed link, and requests drops the Authorization header when the host changes.
    """
    if not _SHA.fullmatch(sha):
        raise SourceError(f"refusing to fetch {repo} at {sha!r}: a run's SHA must be 40 hex digits")
    if not _REPO.fullmatch(repo):
        raise SourceError(f"refusing to fetch {repo!r}: not an owner/name repository")
    target = cached_archive(cache_dir, repo, sha)
    if target.is_file():
        os.utime(target)  # recently used: the cache's size limit evicts the oldest first
        return target
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # every repository's sources
    target.parent.mkdir(exist_ok=True, mode=0o700)
    url = f"{api_url.rstrip('/')}/repos/{repo}/tarball/{sha}"
    headers = {"Authorization": f"token {token}", "Accept": "application/vnd.github+json"}
    try:
        with requests.get(url, headers=headers, stream=True, timeout=(10, 120)) as response:
            _check(response, repo, sha)
            _save(response, target)
    except requests.RequestException as exc:
        # The message names the URL, and a download link's query holds a token: redacted.
        raise SourceError(
            f"could not download {repo} at {sha[:10]}: {redact_text(str(exc))}"
        ) from exc
    return target


def _check(response: requests.Response, repo: str, sha: str) -> None:
    if response.status_code != 200:
        detail = redact_text(response.text[:200].strip())
        raise SourceError(
            f"could not download {repo} at {sha[:10]}: HTTP {response.status_code} {detail}"
        )


def _save(response: requests.Response, target: Path) -> None:
    """Stream to a temporary file beside `target`, then rename: never a half archive in cache."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in response.iter_content(CHUNK):
                size += len(chunk)
                if size > MAX_ARCHIVE_BYTES:
                    raise SourceError(f"archive larger than {MAX_ARCHIVE_BYTES} bytes; refused")
                out.write(chunk)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
