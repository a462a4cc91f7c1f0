"""Source tarballs: GitHub's layout unpacks; hostile entries are refused, nothing written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Literal

import pytest

from workers.archive import ArchiveError, extract_archive

TOP = "octo-widgets-0123456789abcdef0123456789abcdef01234567"


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _entry(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, b""


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info, _ = _entry(name, tarfile.DIRTYPE)
    info.mode = 0o755
    return info, b""


def _write_tar(
    path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], mode: Literal["w", "w:gz"] = "w"
) -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _github_tarball(path: Path) -> Path:
    return _write_tar(
        path,
        [
            _dir(TOP),
            _dir(f"{TOP}/pkg"),
            _file(f"{TOP}/pkg/mod.py", b"VALUE = 42\n"),
            _file(f"{TOP}/README.md", b"# widgets\n"),
            _entry(f"{TOP}/mod_link.py", tarfile.SYMTYPE, "pkg/mod.py"),
            _entry(f"{TOP}/pkg/copy.py", tarfile.LNKTYPE, f"{TOP}/pkg/mod.py"),
        ],
        mode="w:gz",
    )


def test_github_tarball_unpacks_to_the_directory_holding_the_sources(tmp_path: Path) -> None:
    dest = tmp_path / "src"
    root = extract_archive(_github_tarball(tmp_path / "repo.tar.gz"), dest)

    assert root == dest / TOP
    assert (root / "pkg" / "mod.py").read_text() == "VALUE = 42\n"
    assert (root / "README.md").read_text() == "# widgets\n"
    assert (root / "mod_link.py").is_symlink()
    assert (root / "mod_link.py").read_text() == "VALUE = 42\n"
    assert (root / "pkg" / "copy.py").read_text() == "VALUE = 42\n"


def test_archive_with_several_top_level_entries_unpacks_in_place(tmp_path: Path) -> None:
    archive = _write_tar(tmp_path / "flat.tar", [_file("a.py"), _file("b.py")])
    dest = tmp_path / "src"

    assert extract_archive(archive, dest) == dest
    assert sorted(p.name for p in dest.iterdir()) == ["a.py", "b.py"]


HOSTILE = {
    "absolute path": ([_file("/tmp/gpuci-evil")], "/tmp/gpuci-evil"),
    "dotdot path": ([_dir("a"), _file("../evil")], "../evil"),  # path-check: hostile input
    "dotdot inside path": ([_file("a/../../evil")], "a/../../evil"),
    "absolute symlink": ([_entry("l", tarfile.SYMTYPE, "/etc/passwd")], "'l'"),
    "escaping symlink": (
        [_entry("d/l", tarfile.SYMTYPE, "../../outside")],  # path-check: hostile input
        "'d/l'",
    ),
    "absolute hardlink": ([_entry("h", tarfile.LNKTYPE, "/etc/passwd")], "'h'"),
    "escaping hardlink": (
        [_entry("h", tarfile.LNKTYPE, "../outside")],  # path-check: hostile input
        "'h'",
    ),
    "character device": ([_entry("tty", tarfile.CHRTYPE)], "'tty'"),
    "block device": ([_entry("sda", tarfile.BLKTYPE)], "'sda'"),
    "fifo": ([_entry("pipe", tarfile.FIFOTYPE)], "'pipe'"),
    # `s` -> `.` makes `s/t` -> `..` lexically harmless but really the parent of dest.
    "symlink chain": (
        [_entry("s", tarfile.SYMTYPE, "."), _entry("s/t", tarfile.SYMTYPE, "..")],
        "'s/t'",
    ),
    "write through symlink": (
        [_dir("sub"), _entry("l", tarfile.SYMTYPE, "sub"), _file("l/f")],
        "'l/f'",
    ),
    "overwrite symlink": (
        [_file("y"), _entry("x", tarfile.SYMTYPE, "y"), _file("x", b"new")],
        "'x'",
    ),
}


@pytest.mark.parametrize("entries, named", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_entry_is_refused_and_nothing_is_written(
    tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], named: str
) -> None:
    archive = _write_tar(tmp_path / "evil.tar", [_file("innocent.py"), *entries])
    box = tmp_path / "box"
    dest = box / "dest"
    dest.mkdir(parents=True)

    with pytest.raises(ArchiveError, match=named.replace(".", r"\.")):
        extract_archive(archive, dest)

    assert list(dest.iterdir()) == []
    assert list(box.iterdir()) == [dest]
    assert not Path("/tmp/gpuci-evil").exists()


def test_too_many_entries_is_refused(tmp_path: Path) -> None:
    archive = _write_tar(tmp_path / "many.tar", [_file(f"f{i}.py") for i in range(4)])

    with pytest.raises(ArchiveError, match=r"more than 3 entries \(at 'f3.py'\)"):
        extract_archive(archive, tmp_path / "src", max_entries=3)
    assert list((tmp_path / "src").iterdir()) == []


def test_too_many_bytes_is_refused(tmp_path: Path) -> None:
    archive = _write_tar(tmp_path / "big.tar", [_file("a.bin", b"12345"), _file("b.bin", b"678")])

    with pytest.raises(ArchiveError, match=r"more than 7 bytes unpacked \(at 'b.bin'\)"):
        extract_archive(archive, tmp_path / "src", max_total_bytes=7)
    assert list((tmp_path / "src").iterdir()) == []


def test_limits_admit_an_archive_exactly_at_them(tmp_path: Path) -> None:
    archive = _write_tar(tmp_path / "ok.tar", [_file("a.bin", b"12345"), _file("b.bin", b"67")])

    root = extract_archive(archive, tmp_path / "src", max_entries=2, max_total_bytes=7)
    assert (root / "b.bin").read_bytes() == b"67"


def test_file_that_is_not_a_tar_is_refused_with_its_name(tmp_path: Path) -> None:
    archive = tmp_path / "source.tar.gz"
    archive.write_bytes(b"<html>rate limited</html>")

    with pytest.raises(ArchiveError, match=r"source\.tar\.gz"):
        extract_archive(archive, tmp_path / "src")
