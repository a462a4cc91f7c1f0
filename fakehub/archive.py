"""Source archives: a commit's files as GitHub's tarball (one top directory
`<owner>-<repo>-<short sha>/`), and the signed, short-lived download links that point to it."""

from __future__ import annotations

import gzip
import hashlib
import hmac
import io
import tarfile
import time

from fakehub.world import Commit

LINK_LIFETIME = 300  # seconds a download link stays valid


def tarball(owner: str, repo: str, commit: Commit) -> bytes:
    top = f"{owner}-{repo}-{commit.sha[:7]}"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(commit.files):
            data = commit.files[path]
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def link_token(secret: bytes, full_name: str, sha: str, now: float | None = None) -> str:
    expires = int((now if now is not None else time.time()) + LINK_LIFETIME)
    mac = hmac.new(secret, f"{full_name}@{sha}@{expires}".encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def link_valid(secret: bytes, full_name: str, sha: str, token: str) -> bool:
    expires, _, mac = token.partition(".")
    if not expires.isdigit() or int(expires) < time.time():
        return False
    want = hmac.new(secret, f"{full_name}@{sha}@{expires}".encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, mac)
