"""fakehub ships GitHub's descriptions gzipped and unchanged, each with its origin noted."""

from __future__ import annotations

import gzip
import hashlib
import re

import pytest

from fakehub.schema import PACKAGED, REST_DESCRIPTION, WEBHOOK_EXAMPLES, WEBHOOK_SCHEMAS

README = PACKAGED / "README.md"


def recorded_digests() -> dict[str, str]:
    """File name -> SHA-256 of its unpacked JSON, from the rows of fakehub/github/README.md."""
    rows = re.findall(
        r"^\| `([^`]+\.json\.gz)` \|.*\| `([0-9a-f]{64})` \|$", README.read_text(), re.M
    )
    return dict(rows)


def test_every_packaged_file_has_its_origin_noted() -> None:
    packaged = {path.name for path in PACKAGED.glob("*.gz")}
    assert packaged == {f"{n}.gz" for n in (REST_DESCRIPTION, WEBHOOK_SCHEMAS, WEBHOOK_EXAMPLES)}
    assert set(recorded_digests()) == packaged
    assert README.read_text().count("| MIT |") == len(packaged)


@pytest.mark.parametrize("name", [REST_DESCRIPTION, WEBHOOK_SCHEMAS, WEBHOOK_EXAMPLES])
def test_packaged_description_is_githubs_unchanged(name: str) -> None:
    unpacked = gzip.decompress((PACKAGED / f"{name}.gz").read_bytes())
    assert hashlib.sha256(unpacked).hexdigest() == recorded_digests()[f"{name}.gz"]
