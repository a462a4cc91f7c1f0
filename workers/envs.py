"""A run's Python environment: a fresh virtual environment layered on a base environment the
host provides. The run sees the base's packages, and what its setup installs goes into its own
layer, which is deleted with the run. Installs go through uv where the host has it (`pip` in the
layer is uv's pip), else through pip."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class EnvError(Exception):
    """A base environment cannot be used; the message names it and what is wrong."""


@dataclass(frozen=True)
class PythonLayout:
    """Where a base interpreter and its packages live, as the interpreter itself reports."""

    python: str
    executable: str  # the real file
    prefix: str
    base_prefix: str
    site_dirs: tuple[str, ...]
    version: str
    has_pip: bool

    def visible_paths(self) -> tuple[Path, ...]:
        """What a sandbox must show (read-only) for the interpreter and its packages to work."""
        paths = {self.prefix, self.base_prefix, str(Path(self.executable).parent), *self.site_dirs}
        return tuple(sorted(Path(p) for p in paths if p))

    @property
    def bin_dir(self) -> str:
        return str(Path(self.python).parent)


_INSPECT = """\
import importlib.util, json, site, sys
dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "site_dirs": dirs, "version": ".".join(map(str, sys.version_info[:3])),
    "has_pip": importlib.util.find_spec("pip") is not None,
}))
"""


def inspect_python(python: str) -> PythonLayout:
    """The layout of the base interpreter `python` (cached while its file is unchanged)."""
    try:
        stamp = os.stat(python).st_mtime_ns
    except OSError as exc:
        raise EnvError(f"base interpreter {python} does not exist ({exc.strerror})") from None
    return _inspect(python, stamp)


@functools.lru_cache(maxsize=64)
def _inspect(python: str, _stamp: int) -> PythonLayout:
    try:
        done = subprocess.run(
            [python, "-I", "-c", _INSPECT], capture_output=True, text=True, timeout=60, check=False
        )
        data = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise EnvError(f"base interpreter {python} does not run: {exc}") from None
    if not isinstance(data, dict):
        raise EnvError(f"base interpreter {python} does not run: {done.stderr.strip()[-300:]}")
    return PythonLayout(
        python=python,
        executable=os.path.realpath(data["executable"]),
        prefix=data["prefix"],
        base_prefix=data["base_prefix"],
        site_dirs=tuple(data["site_dirs"]),
        version=data["version"],
        has_pip=bool(data["has_pip"]),
    )


def find_uv(setting: str = "") -> str | None:
    """uv for installs: the setting (a path, or `none` for pip), else beside this Python, else on
    PATH; None where the host has none."""
    if setting.strip().lower() == "none":
        return None
    if setting.strip():
        if not os.access(setting, os.X_OK):
            raise EnvError(f"GPUCI_UV={setting} is not an executable file; give uv's path")
        return os.path.realpath(setting)
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which("uv")
    return os.path.realpath(found) if found else None


@dataclass(frozen=True)
class Layer:
    """A run's virtual environment at `root`, layered on `base`."""

    root: Path
    base: PythonLayout
    uv: str | None

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def installer(self) -> str:
        return "uv" if self.uv else "pip"

    def create_command(self) -> list[str]:
        """Run by the base interpreter, as the run's user, inside the run's sandbox."""
        sites = json.dumps(list(self.base.site_dirs))
        return [self.base.python, "-I", "-c", _CREATE, str(self.root), self.uv or "", sites]

    def environ(self, path: str) -> dict[str, str]:
        """Variables that make the layer the run's Python, `pip` included."""
        env = {
            "VIRTUAL_ENV": str(self.root),
            "PATH": os.pathsep.join([str(self.root / "bin"), self.base.bin_dir, path]),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
        if self.uv:
            # Never a Python download; copies, not hardlinks into the cache: a run that edits
            # an installed file must not edit what the next run installs.
            env.update(UV_PYTHON_DOWNLOADS="never", UV_LINK_MODE="copy", UV_NO_PROGRESS="1")
            env["UV_PYTHON"] = self.python
        return env

    def visible_paths(self) -> tuple[Path, ...]:
        return (*self.base.visible_paths(), *((Path(self.uv),) if self.uv else ()))


# Creates the layer: a virtual environment (uv's, or the standard library's), a .pth that adds
# the base's site directories after the layer's own, a metadata-only copy of each base
# distribution (so that uv, which reads only the layer's site-packages, counts them as
# installed; uninstalling one removes only the copy), and `pip` commands.
_CREATE = """\
import json, os, shutil, subprocess, sys, sysconfig, venv
root, uv, sites = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
has_pip = __import__("importlib.util").util.find_spec("pip") is not None
if uv:
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, root], check=True)
else:
    venv.EnvBuilder(symlinks=True, with_pip=not has_pip).create(root)
own = sysconfig.get_path("purelib", vars={"base": root, "platbase": root})
with open(os.path.join(own, "_gpuci_base.pth"), "w") as pth:
    pth.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in sites) + "\\n")
for site in sites:
    for name in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        meta = "METADATA" if name.endswith(".dist-info") else "PKG-INFO"
        source = os.path.join(site, name, meta)
        copy = os.path.join(own, name)
        if not name.endswith((".dist-info", ".egg-info")) or not os.path.isfile(source):
            continue
        if os.path.exists(copy):
            continue  # an earlier site directory has it first on sys.path
        os.mkdir(copy)
        shutil.copyfile(source, os.path.join(copy, meta))
        with open(os.path.join(copy, "INSTALLER"), "w") as f:
            f.write("gpuci-base\\n")
        with open(os.path.join(copy, "RECORD"), "w") as f:
            f.write("".join(f"{name}/{n},,\\n" for n in (meta, "INSTALLER", "RECORD")))
command = f'exec "{uv}" pip "$@"' if uv else f'exec "{root}/bin/python" -m pip "$@"'
for tool in ("pip", "pip3"):
    path = os.path.join(root, "bin", tool)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as f:
        f.write("#!/bin/sh\\n" + command + "\\n")
    os.chmod(path, 0o755)
"""
