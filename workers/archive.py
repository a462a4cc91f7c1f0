"""Unpacking a source tarball so that no entry can land, or point, outside its directory."""

from __future__ import annotations

import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

MAX_ENTRIES = 100_000
MAX_TOTAL_BYTES = 2 * 1024**3
# Path components looked up while checking the whole archive (names, link targets, the symlinks
# they go through): bounds the work a hostile archive can ask for; a large repository needs ~1 M.
MAX_PATH_STEPS = 4_000_000
MAX_SYMLINK_HOPS = 40  # Linux's own limit on symlinks followed in one lookup (else ELOOP)
MAX_PATH_BYTES = 4096  # PATH_MAX: a longer name cannot be written anyway
MAX_NAME_BYTES = 255  # NAME_MAX, for each component
# PEP 706's filter came in 3.11.4; its symlink fix (cpython gh-107845) in 3.11.5: before it,
# the filter refuses symlinks such as `docs/x -> ../README.md`.
SAFE_TARFILE_PYTHON = (3, 11, 5)


class ArchiveError(Exception):
    """The archive is unreadable or holds an entry that is refused; the message names it."""


def extract_archive(
    archive: Path,
    dest: Path,
    *,
    max_entries: int = MAX_ENTRIES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_path_steps: int = MAX_PATH_STEPS,
) -> Path:
    """Extract a tar (optionally compressed) into the empty `dest`; return the sources' directory.

    Every entry is checked before anything is written, against what the entries before it will
    have written, so a refused archive writes nothing. GitHub tarballs hold one top-level
    `owner-repo-sha/` directory: that directory is returned; an archive with several top-level
    entries returns `dest` itself.
    """
    check_python(sys.version_info[:3])
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ArchiveError(f"{archive.name}: {dest} is not empty")
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _checked_members(tar, max_entries, max_total_bytes, max_path_steps)
            # Second line of defence: the stdlib's own "data" filter re-checks each entry.
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"{archive.name}: cannot extract: {exc}") from exc
    return _source_root(dest)


def check_python(version: tuple[int, ...]) -> None:
    """Refuse an interpreter whose tarfile has no extraction filter, or one that misjudges links."""
    if version < SAFE_TARFILE_PYTHON:
        need = ".".join(map(str, SAFE_TARFILE_PYTHON))
        this = ".".join(map(str, version))
        raise ArchiveError(
            f"Python {need} or later is needed for safe tar extraction (this is {this})"
        )


def _checked_members(
    tar: tarfile.TarFile, max_entries: int, max_total_bytes: int, max_path_steps: int
) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    tree = _Tree(max_path_steps)
    total = 0
    for member in tar:
        if len(members) >= max_entries:
            raise ArchiveError(f"more than {max_entries} entries (at {member.name!r})")
        tree.add(member)
        total += member.size if member.isreg() else 0
        if total > max_total_bytes:
            raise ArchiveError(f"more than {max_total_bytes} bytes unpacked (at {member.name!r})")
        members.append(member)
    return members


class _Dir:
    """A directory of the simulated extraction: what is in it, by name."""

    def __init__(self) -> None:
        self.entries: dict[str, _Dir | _Symlink | _File] = {}


@dataclass(frozen=True)
class _Symlink:
    target: str


class _File:
    """A regular file (or a hardlink to one) of the simulated extraction."""


_FILE = _File()


class _Tree:
    """What the extraction will have written so far, entry by entry, into an empty directory.

    No entry is written through a symlink or replaces one of another kind (only a directory may
    repeat, as a directory), so the extraction itself never follows a symlink, and directories and
    symlinks once written never change. A symlink target may go through earlier symlinks, but
    '..' is taken only out of a directory that already exists: so a target found inside the
    destination when its entry is checked stays inside whatever later entries add.
    """

    def __init__(self, max_steps: int) -> None:
        self.root = _Dir()
        self.max_steps = max_steps
        self.steps = 0

    def add(self, member: tarfile.TarInfo) -> None:
        """Raise ArchiveError when the entry could write, or point, outside the destination."""
        name = member.name
        parts = _name_parts(name, name)
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise ArchiveError(f"entry {name!r} is a device, fifo or other special file")
        if not parts:
            if member.isdir():
                return
            raise ArchiveError(f"entry {name!r} names the destination itself")
        dirs = self._directories(name, parts[:-1], create=True)
        assert dirs is not None  # made where missing
        here, last = dirs[-1], parts[-1]
        earlier = here.entries.get(last)
        if earlier is not None and not (member.isdir() and isinstance(earlier, _Dir)):
            raise ArchiveError(f"entry {name!r} replaces an earlier entry of that name")
        if member.isdir():
            here.entries.setdefault(last, _Dir())
        elif member.issym():
            # Written first, so that a target coming back through it loops as it will on disk.
            here.entries[last] = _Symlink(member.linkname)
            self._check_target(name, dirs, member.linkname)
        else:
            if member.islnk():
                self._check_hardlink(name, member.linkname)
            here.entries[last] = _FILE

    def _directories(self, name: str, parts: list[str], *, create: bool) -> list[_Dir] | None:
        """The directories from the root down `parts`, none through a symlink or a file; None
        where one is missing and not `create`d (the extraction makes missing parents)."""
        dirs = [self.root]
        for i, part in enumerate(parts):
            self._step(name)
            node = dirs[-1].entries.get(part)
            if node is None:
                if not create:
                    return None
                node = dirs[-1].entries[part] = _Dir()
            if not isinstance(node, _Dir):
                what = "symlink" if isinstance(node, _Symlink) else "file"
                raise ArchiveError(
                    f"entry {name!r} goes through {what} {'/'.join(parts[: i + 1])!r}"
                )
            dirs.append(node)
        return dirs

    def _check_hardlink(self, name: str, linkname: str) -> None:
        """A hardlink must name an earlier regular file: to anything else, the extraction either
        fails halfway or (to a symlink) copies that symlink to where it points elsewhere."""
        parts = _name_parts(name, linkname, kind="hardlink target")
        dirs = self._directories(name, parts[:-1], create=False) if parts else None
        if dirs is None or not isinstance(dirs[-1].entries.get(parts[-1]), _File):
            raise ArchiveError(f"hardlink {name!r} does not name an earlier file: {linkname!r}")

    def _check_target(self, name: str, dirs: list[_Dir], linkname: str) -> None:
        """Follow the symlink's target from its directory through the archive's earlier symlinks."""
        if linkname.startswith(("/", "\\")):
            raise ArchiveError(f"symlink {name!r} points outside the archive: {linkname!r}")
        _check_length(name, linkname)
        stack = list(dirs)  # the directories, from the root, down to where the target has got
        pending = _parts(linkname)[::-1]
        settled = True  # stack[-1] is where the target has got, not a missing name or a file
        hops = 1  # this symlink: a lookup through it follows it, then the ones its target meets
        while pending:
            part = pending.pop()
            self._step(name)
            if part == ".." and not settled:
                raise ArchiveError(
                    f"symlink {name!r} climbs out of a path that is not an earlier directory: "
                    f"{linkname!r}"
                )
            if part == "..":
                if len(stack) == 1:
                    raise ArchiveError(f"symlink {name!r} points outside the archive: {linkname!r}")
                stack.pop()
            elif settled:
                node = stack[-1].entries.get(part)
                if isinstance(node, _Dir):
                    stack.append(node)
                elif isinstance(node, _Symlink):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise ArchiveError(
                            f"symlink {name!r} goes through more than {MAX_SYMLINK_HOPS} symlinks"
                        )
                    pending.extend(_parts(node.target)[::-1])
                else:
                    settled = False

    def _step(self, name: str) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise ArchiveError(f"more than {self.max_steps} path lookups (at {name!r})")


def _name_parts(name: str, raw: str, kind: str = "path") -> list[str]:
    """The components of an entry's name (or hardlink target), relative to the archive root."""
    if raw.startswith(("/", "\\")):
        raise ArchiveError(f"entry {name!r} has an absolute {kind}: {raw!r}")
    _check_length(name, raw)
    parts = _parts(raw)
    if ".." in parts:
        raise ArchiveError(f"entry {name!r} has a '..' component in its {kind}: {raw!r}")
    return parts


def _check_length(name: str, raw: str) -> None:
    """A path the kernel would refuse fails the extraction halfway: refuse it before."""
    if len(raw.encode(errors="surrogateescape")) >= MAX_PATH_BYTES:
        raise ArchiveError(f"entry {name[:64]!r}...: a path of {MAX_PATH_BYTES} bytes or more")
    for part in _parts(raw):
        if len(part.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
            raise ArchiveError(f"entry {name!r}: a component longer than {MAX_NAME_BYTES} bytes")


def _parts(raw: str) -> list[str]:
    return [part for part in raw.split("/") if part not in ("", ".")]


def _source_root(dest: Path) -> Path:
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return dest
