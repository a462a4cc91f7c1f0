"""Reading the files a run wrote without trusting the run: never through a symbolic link, only
regular files, never more than a cap. The run's user controls the directory; the worker reads
what is there by file descriptor and keeps its own copy."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_CHUNK = 1024 * 1024


class ResultFileError(Exception):
    """The file is absent, not a regular file, a link, or over the cap; the message says which."""


def _open(directory: Path, name: str) -> int:
    """A read descriptor for `directory/name`; neither the directory nor the file may be a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ResultFileError(f"{directory} is not a directory ({exc.strerror})") from None
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise ResultFileError(f"{name} was not written") from None
    except OSError as exc:  # ELOOP: a symbolic link
        raise ResultFileError(f"{name} is not a regular file ({exc.strerror})") from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ResultFileError(f"{name} is not a regular file")
    return fd


def read_result(directory: Path, name: str, max_bytes: int) -> bytes:
    """The content of a small result file (a count, the preflight's versions)."""
    fd = _open(directory, name)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ResultFileError(f"{name} is over {max_bytes} bytes")
    return data


def copy_result(directory: Path, name: str, target: Path, max_bytes: int) -> Path | None:
    """Copy `directory/name` to `target` (a path of the worker's); None when it was not written."""
    try:
        fd = _open(directory, name)
    except ResultFileError as exc:
        if "was not written" in str(exc):
            return None
        raise
    copied = 0
    with os.fdopen(fd, "rb") as source, target.open("wb") as out:
        while chunk := source.read(_CHUNK):
            copied += len(chunk)
            if copied > max_bytes:
                out.close()
                target.unlink()
                raise ResultFileError(f"{name} is over {max_bytes} bytes")
            out.write(chunk)
    return target
