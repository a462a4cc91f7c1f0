"""fakehub ships GitHub's descriptions gzipped; they must equal the shared originals."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from fakehub.schema import PACKAGED

SHARED = Path(__file__).resolve().parents[2] / "shared" / "github"


@pytest.mark.parametrize("name", ["rest-api-subset.json", "webhook-schemas.json"])
def test_packaged_description_is_githubs_unchanged(name: str) -> None:
    if not (SHARED / name).is_file():
        pytest.skip(f"no shared copy of {name} beside this checkout")
    packed = gzip.decompress((PACKAGED / f"{name}.gz").read_bytes())
    assert packed == (SHARED / name).read_bytes()
