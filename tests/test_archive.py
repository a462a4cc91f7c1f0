"""Source tarballs: GitHub's layout unpacks; hostile entries are refused, nothing written."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from typing import Literal

import pytest

from workers.archive import ArchiveError, check_python, extract_archive

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


def test_links_that_stay_inside_unpack_and_resolve(tmp_path: Path) -> None:
    archive = _write_tar(
        tmp_path / "links.tar",
        [
            _dir("./"),
            _file("./README.md", b"# widgets\n"),
            _dir("docs"),
            _entry("docs/readme", tarfile.SYMTYPE, "../README.md"),  # path-check: hostile input
            _entry("docs/up", tarfile.SYMTYPE, ".."),
            _entry("via_up", tarfile.SYMTYPE, "docs/up/README.md"),
            _entry("docs/later", tarfile.SYMTYPE, "../z/f.txt"),  # path-check: hostile input
            _dir("docs"),
            _file("z/f.txt", b"late\n"),
        ],
    )
    root = extract_archive(archive, tmp_path / "src")

    assert (root / "docs" / "readme").read_text() == "# widgets\n"
    assert (root / "via_up").read_text() == "# widgets\n"
    assert (root / "docs" / "later").read_text() == "late\n"


def test_a_chain_of_as_many_symlinks_as_the_kernel_follows_unpacks(tmp_path: Path) -> None:
    # l0 -> l1 -> ... -> l39 -> f: reading l0 follows 40 symlinks, Linux's most.
    chain = [
        _entry(f"l{i}", tarfile.SYMTYPE, f"l{i + 1}" if i < 39 else "f") for i in range(39, -1, -1)
    ]
    archive = _write_tar(tmp_path / "chain.tar", [_file("f", b"end"), *chain])

    assert (extract_archive(archive, tmp_path / "src") / "l0").read_bytes() == b"end"


def test_symlink_work_is_bounded(tmp_path: Path) -> None:
    # Each link re-walks the chain before it: 1 + 2 + ... lookups, over a budget of 50.
    chain = [
        _entry(f"l{i}", tarfile.SYMTYPE, f"l{i + 1}" if i < 19 else "f") for i in range(19, -1, -1)
    ]
    archive = _write_tar(tmp_path / "chain.tar", [_file("f"), *chain])

    with pytest.raises(ArchiveError, match=r"more than 50 path lookups \(at 'l\d+'\)"):
        extract_archive(archive, tmp_path / "src", max_path_steps=50)
    assert list((tmp_path / "src").iterdir()) == []


def test_destination_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    archive = _write_tar(tmp_path / "ok.tar", [_file("a.py")])
    dest = tmp_path / "src"
    dest.mkdir()
    (dest / "old.py").write_text("")

    with pytest.raises(ArchiveError, match="is not empty"):
        extract_archive(archive, dest)
    assert [p.name for p in dest.iterdir()] == ["old.py"]


@pytest.mark.parametrize("version", [(3, 11, 2), (3, 11, 4), (3, 10, 12)])
def test_python_without_a_sound_extraction_filter_is_refused(version: tuple[int, ...]) -> None:
    this = ".".join(map(str, version))
    with pytest.raises(ArchiveError) as refused:
        check_python(version)
    assert str(refused.value) == (
        f"Python 3.11.5 or later is needed for safe tar extraction (this is {this})"
    )


@pytest.mark.parametrize("version", [(3, 11, 5), (3, 12, 0), (3, 13, 1)])
def test_python_with_a_sound_extraction_filter_is_accepted(version: tuple[int, ...]) -> None:
    check_python(version)


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
    # `a/l` -> `..` is the root, so `a/l/..` is its parent: lexically it is `a`.
    "symlink target through an earlier symlink": (
        [_entry("a/l", tarfile.SYMTYPE, ".."), _entry("b", tarfile.SYMTYPE, "a/l/..")],
        "'b'",
    ),
    "two-hop chain through a symlinked directory": (
        [
            _entry("a/l", tarfile.SYMTYPE, ".."),
            _entry("r/a", tarfile.SYMTYPE, "../a"),  # path-check: hostile input
            _entry("r/b", tarfile.SYMTYPE, "a/l/../.."),
        ],
        "'r/b'",
    ),
    # Nothing is at `r/a` yet: what `..` out of it means is up to later entries.
    "climbing out of a path not yet made": (
        [_entry("a/l", tarfile.SYMTYPE, ".."), _entry("r/b", tarfile.SYMTYPE, "a/l/../..")],
        "'r/b'",
    ),
    "later symlink turning an earlier target outside": (
        [_entry("b", tarfile.SYMTYPE, "p/.."), _entry("p", tarfile.SYMTYPE, ".")],
        "'b'",
    ),
    "target with empty and dot components": (
        [_entry("d/l", tarfile.SYMTYPE, ".//..//./..")],
        "'d/l'",
    ),
    "write through a nested symlink": (
        [_entry("a/l", tarfile.SYMTYPE, "."), _file("a/l/x")],
        "'a/l/x'",
    ),
    "write through a symlink, spelt with empty and dot components": (
        [_dir("sub"), _entry("l", tarfile.SYMTYPE, "sub"), _file(".//l/./x")],
        "'.//l/./x'",
    ),
    "write beneath a file": ([_file("f"), _file("f/g")], "'f/g'"),
    "hardlink to an earlier symlink": (
        [
            _entry("a/b/l", tarfile.SYMTYPE, "../x"),  # path-check: hostile input
            _entry("h", tarfile.LNKTYPE, "a/b/l"),
        ],
        "'h'",
    ),
    "hardlink through an earlier symlink": (
        [
            _dir("sub"),
            _file("sub/f"),
            _entry("s", tarfile.SYMTYPE, "sub"),
            _entry("h", tarfile.LNKTYPE, "s/f"),
        ],
        "'h'",
    ),
    "hardlink to a directory": ([_dir("d"), _entry("h", tarfile.LNKTYPE, "d")], "'h'"),
    "hardlink to a later entry": (
        [_entry("h", tarfile.LNKTYPE, "later.py"), _file("later.py")],
        "'h'",
    ),
    "directory replaced by a symlink": (
        [_dir("a"), _entry("b", tarfile.SYMTYPE, "a/.."), _entry("a", tarfile.SYMTYPE, ".")],
        "'a'",
    ),
    "symlink replaced by a directory": (
        [_dir("sub"), _entry("l", tarfile.SYMTYPE, "sub"), _dir("l")],
        "'l'",
    ),
    "file replaced by a directory": ([_file("f"), _dir("f")], "'f'"),
    "duplicate file": ([_file("f", b"1"), _file("f", b"2")], "'f'"),
    "duplicate symlink": (
        [_entry("l", tarfile.SYMTYPE, "a"), _entry("l", tarfile.SYMTYPE, "b")],
        "'l'",
    ),
    "symlink named for the destination": ([_entry("./", tarfile.SYMTYPE, "sub")], "'./'"),
    "empty-named symlink": ([_entry("", tarfile.SYMTYPE, "sub")], "''"),
    "file named for the destination": ([_file(".")], "'.'"),
    "symlink loop": (
        [_entry("x", tarfile.SYMTYPE, "y"), _entry("y", tarfile.SYMTYPE, "x")],
        "'y'",
    ),
    # l0 -> l1 -> ... -> l40 -> f: 41 symlinks, one more than Linux follows in a lookup.
    "symlink chain longer than the kernel follows": (
        [_file("f")]
        + [
            _entry(f"l{i}", tarfile.SYMTYPE, f"l{i + 1}" if i < 40 else "f")
            for i in range(40, -1, -1)
        ],
        "'l0'",
    ),
    "name longer than PATH_MAX": ([_file("d/" * 2048 + "f")], "4096 bytes or more"),
    "component longer than NAME_MAX": ([_file("x" * 256)], "longer than 255 bytes"),
}


@pytest.mark.parametrize("entries, named", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_entry_is_refused_and_nothing_is_written(
    tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], named: str
) -> None:
    archive = _write_tar(tmp_path / "evil.tar", [_file("innocent.py"), *entries])
    dest = tmp_path / "up2" / "up1" / "dest"  # two empty levels catch a climb of one or two
    dest.mkdir(parents=True)

    with pytest.raises(ArchiveError, match=re.escape(named)):
        extract_archive(archive, dest)

    assert list(dest.iterdir()) == []
    assert list(dest.parent.iterdir()) == [dest]
    assert list(dest.parent.parent.iterdir()) == [dest.parent]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar", "up2"]
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
