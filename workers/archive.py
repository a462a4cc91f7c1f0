"""Unpacking a source tarball so that no entry can land outside its directory."""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

MAX_ENTRIES = 100_000
MAX_TOTAL_BYTES = 2 * 1024**3


class ArchiveError(Exception):
    """The archive is unreadable or holds an entry that is refused; the message names it."""


def extract_archive(
    archive: Path,
    dest: Path,
    *,
    max_entries: int = MAX_ENTRIES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> Path:
    """Extract a tar (optionally compressed) into `dest` and return the directory of the sources.

    Every entry is checked before anything is written, so a refused archive writes nothing.
    GitHub tarballs hold one top-level `owner-repo-sha/` directory: that directory is returned;
    an archive with several top-level entries returns `dest` itself.
    """
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _checked_members(tar, max_entries, max_total_bytes)
            # Second line of defence: the stdlib's own "data" filter re-checks each entry.
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"{archive.name}: cannot extract: {exc}") from exc
    return _source_root(dest)


def _checked_members(
    tar: tarfile.TarFile, max_entries: int, max_total_bytes: int
) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    symlinks: set[PurePosixPath] = set()
    total = 0
    for member in tar:
        if len(members) >= max_entries:
            raise ArchiveError(f"more than {max_entries} entries (at {member.name!r})")
        _check_member(member, symlinks)
        total += member.size if member.isreg() else 0
        if total > max_total_bytes:
            raise ArchiveError(f"more than {max_total_bytes} bytes unpacked (at {member.name!r})")
        if member.issym():
            symlinks.add(_entry_path(member.name))
        members.append(member)
    return members


def _check_member(member: tarfile.TarInfo, symlinks: set[PurePosixPath]) -> None:
    """Raise ArchiveError when the entry could write, or point, outside the destination."""
    name = member.name
    path = _checked_path(name, name)
    _check_not_through_symlink(name, path, symlinks)
    if member.issym():
        target = PurePosixPath(member.linkname)
        if target.is_absolute() or _escapes(path.parent / target):
            raise ArchiveError(f"symlink {name!r} points outside the archive: {member.linkname!r}")
    elif member.islnk():
        target = _checked_path(name, member.linkname, kind="hardlink target")
        _check_not_through_symlink(name, target, symlinks)
    elif not (member.isreg() or member.isdir()):
        raise ArchiveError(f"entry {name!r} is a device, fifo or other special file")


def _check_not_through_symlink(
    name: str, path: PurePosixPath, symlinks: set[PurePosixPath]
) -> None:
    """An earlier symlink entry on the way could redirect the write anywhere: refuse it."""
    through = [p for p in [path, *path.parents] if p in symlinks]
    if through:
        raise ArchiveError(f"entry {name!r} goes through symlink {str(through[0])!r}")


def _checked_path(name: str, raw: str, kind: str = "path") -> PurePosixPath:
    path = PurePosixPath(raw)
    if path.is_absolute() or raw.startswith("\\"):
        raise ArchiveError(f"entry {name!r} has an absolute {kind}: {raw!r}")
    if ".." in path.parts:
        raise ArchiveError(f"entry {name!r} has a '..' component in its {kind}: {raw!r}")
    return _entry_path(raw)


def _entry_path(raw: str) -> PurePosixPath:
    return PurePosixPath(*[part for part in PurePosixPath(raw).parts if part != "."])


def _escapes(path: PurePosixPath) -> bool:
    """True when `path`, relative to the archive root, leaves it once `..` is resolved."""
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def _source_root(dest: Path) -> Path:
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return dest
