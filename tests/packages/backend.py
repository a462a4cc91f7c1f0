"""A PEP 517 build backend of nothing but the standard library, for the tests' local packages:
they build and install with uv or pip without any download. A project using it has
`package.json` beside it (name, version, requires) and its modules under `src/`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path


def write_wheel(
    directory: str | Path,
    name: str,
    version: str,
    files: dict[str, str],
    requires: list[str] | tuple[str, ...] = (),
) -> str:
    """Write `<name>-<version>-py3-none-any.whl` holding `files` (path -> text); its file name."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = {
        **files,
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpuci-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    wheel = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(Path(directory) / wheel, "w") as archive:
        for path, text in entries.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return wheel


def _package() -> tuple[str, str, list[str]]:
    data = json.loads(Path("package.json").read_text())
    return str(data["name"]), str(data["version"]), [str(r) for r in data["requires"]]


def _sources() -> dict[str, str]:
    root = Path("src")
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.py")}


def get_requires_for_build_wheel(config_settings: object = None) -> list[str]:
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(
    wheel_directory: str, config_settings: object = None, metadata_directory: object = None
) -> str:
    name, version, requires = _package()
    return write_wheel(wheel_directory, name, version, _sources(), requires)


def build_editable(
    wheel_directory: str, config_settings: object = None, metadata_directory: object = None
) -> str:
    name, version, requires = _package()
    files = {f"_{name}_editable.pth": os.path.abspath("src") + "\n"}
    return write_wheel(wheel_directory, name, version, files, requires)
