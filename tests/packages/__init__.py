"""Local Python packages for the tests: wheels and buildable projects, made without a network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.packages.backend import write_wheel

BACKEND = Path(__file__).with_name("backend.py")

__all__ = ["module_wheel", "write_project", "write_wheel"]


def module_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel of one module `name` whose `__version__` is `version`."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {f"{name}.py": f"__version__ = {version!r}\n"}
    return directory / write_wheel(directory, name, version, files, requires)


def write_project(root: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A project at `root` (module `name`, `pip install -e .`-able) built by tests' backend."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / f"{name}.py").write_text(f"__version__ = {version!r}\n")
    shutil.copyfile(BACKEND, root / "gpuci_test_backend.py")
    (root / "package.json").write_text(
        json.dumps({"name": name, "version": version, "requires": list(requires)})
    )
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "gpuci_test_backend"\n'
        'backend-path = ["."]\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
        f"dependencies = {json.dumps(list(requires))}\n"
    )
    return root
