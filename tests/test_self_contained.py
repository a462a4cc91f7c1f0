"""A clone of the repository alone has everything its code, tests, demo and benchmarks read:
no file names a path outside the repository."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A line may carry this to say its escaping path is hostile input that a test feeds to gpuci
# (an archive entry that must be refused), not a path anything reads.
HOSTILE = "path-check: hostile input"
SKIPPED_SUFFIXES = (".gz", ".png", ".ico", ".pyc")

_CLIMB = re.compile(r"(?<![A-Za-z0-9_./-])((?:\.\./)+)([A-Za-z0-9_.-]*)")
_FILE_PARENTS = re.compile(
    r"Path\(__file__\)(?:\.resolve\(\))?(?:\.parents\[(\d+)\]|((?:\.parent)+))"
)
_ROOT_PARENT = re.compile(r"\b(?:ROOT|REPO|REPO_ROOT)\.parent\b")
# The directory the checkout sits in (its siblings, such as a shared folder next to it), unless
# that is a system-wide one whose name files may well use for their own ends (/tmp/...).
_SIBLINGS = (
    ""
    if ROOT.parent in {Path("/"), Path(tempfile.gettempdir()), Path.home()}
    else f"{ROOT.parent}/"
)


def repository_files() -> list[Path]:
    """Tracked and not-ignored files: what a clone (with this session's work) holds."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:  # an unpacked tarball: every file but the ignored kinds
        return [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    names = [n for n in listed.stdout.decode().split("\0") if n]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def outside_references(path: Path, text: str) -> list[str]:
    """Each place in `text` (the file at `path`) that names something outside the repository."""
    found = []
    depth = len(path.relative_to(ROOT).parts) - 1  # directories between the root and the file
    for number, line in enumerate(text.splitlines(), 1):
        if HOSTILE in line:
            continue
        where = f"{path.relative_to(ROOT)}:{number}"
        for climb, name in _CLIMB.findall(line):
            # Relative to the file (links, data files) or, for a path that is not there, to the
            # root (a command's working directory): leaving the repository either way is out.
            target = (path.parent / climb / name).resolve()
            from_root = (ROOT / climb / name).resolve()
            if not _inside(target) or not (target.exists() or _inside(from_root)):
                found.append(f"{where}: {climb}{name} leaves the repository")
        for index, chain in _FILE_PARENTS.findall(line):
            up = int(index) + 1 if index else chain.count(".parent")
            if up > depth + 1:
                found.append(f"{where}: Path(__file__) {up} levels up leaves the repository")
        if _ROOT_PARENT.search(line):
            found.append(f"{where}: the repository root's parent is outside it")
        if _SIBLINGS and _SIBLINGS in line:
            found.append(f"{where}: names this machine's path {_SIBLINGS}")
    return found


def _inside(path: Path) -> bool:
    return path == ROOT or ROOT in path.parents


def test_no_file_names_a_path_outside_the_repository() -> None:
    problems = []
    for path in repository_files():
        if path.suffix in SKIPPED_SUFFIXES or path == Path(__file__).resolve():  # its examples
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += outside_references(path, text)
    assert problems == []


@pytest.mark.parametrize(
    ("relative", "line", "why"),
    [
        ("tests/t.py", 'X = Path(__file__).resolve().parents[2] / "sibling"', "3 levels up"),
        ("tests/t.py", "EXAMPLES = Path(__file__).parent.parent.parent", "3 levels up"),
        ("bench/b.py", 'EXAMPLES = ROOT.parent / "sibling" / "data"', "root's parent"),
        ("docs/d.md", "see `../sibling/notes.json`", "../sibling"),
        ("docs/d.md", "see ../../elsewhere/notes.md", "../../elsewhere"),
        ("bench/b.py", f'DATA = "{ROOT.parent}/sibling/x.json"', "this machine's path"),
    ],
)
def test_the_check_catches_each_way_out(relative: str, line: str, why: str) -> None:
    if why == "this machine's path" and not _SIBLINGS:
        pytest.skip(f"the checkout sits in {ROOT.parent}, whose paths files may name")
    problems = outside_references(ROOT / relative, line)
    assert len(problems) == 1 and why in problems[0]


@pytest.mark.parametrize(
    ("relative", "line"),
    [
        ("docs/d.md", "[manifest](../app-manifest.json)"),
        ("tests/data/w.yml", "files: ../../examples/sample-repo"),
        ("tests/t.py", "ROOT = Path(__file__).resolve().parent.parent"),
        ("tests/t.py", f'_entry("d/l", SYMTYPE, "../../../x"),  # {HOSTILE}'),
        ("bot/x.py", "a/../../b is refused"),
    ],
)
def test_paths_inside_the_repository_pass(relative: str, line: str) -> None:
    assert outside_references(ROOT / relative, line) == []
