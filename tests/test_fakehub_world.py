"""World files: keys, sources from directories, forks, and the errors a bad file gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from fakehub.world import WorldError, build_world, load_world

WORLD = Path(__file__).parent / "data" / "world-basic.yml"


def test_generated_key_is_written_where_asked(tmp_path: Path) -> None:
    world = load_world(WORLD, key_path=tmp_path / "app.pem")
    written = (tmp_path / "app.pem").read_bytes()
    assert written == world.app.private_key_pem
    key = serialization.load_pem_private_key(written, password=None)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert public == world.app.public_key_pem


def test_sources_from_a_directory_overlay_the_default_branch(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text("X = 2\n")
    data = {
        "app": {"id": 1, "generate": True},
        "users": [{"login": "me", "id": 5}],
        "repos": [{"full_name": "me/r", "files": {"a.txt": "a"}, "sources": {"dev": "src"}}],
        "pulls": [{"repo": "me/r", "head": {"ref": "dev"}, "author": "me"}],
    }
    world = build_world(data, base_dir=tmp_path)
    pull = world.pulls[("me/r", 1)]
    files = world.commits[pull.head_sha].files
    assert files == {"a.txt": b"a", "pkg/mod.py": b"X = 2\n"}
    assert len(pull.head_sha) == 40
    assert build_world(data, base_dir=tmp_path).pulls[("me/r", 1)].head_sha == pull.head_sha


def test_forks_start_from_their_parent(tmp_path: Path) -> None:
    world = load_world(WORLD)
    fork, parent = world.repos["outsider/sample"], world.repos["acme/sample"]
    assert fork.branches["main"] == parent.branches["main"]
    assert world.role(parent, "outsider") is None
    assert world.role(parent, "acme") == "admin"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "missing key 'app'"),
        ({"app": {"id": 1}}, "private_key_path"),
        (
            {
                "app": {"id": 1, "generate": True},
                "repos": [{"full_name": "a/b", "collaborators": {"x": "owner"}}],
            },
            "role 'owner'",
        ),
    ],
)
def test_bad_worlds_say_what_is_wrong(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    with pytest.raises(WorldError, match=message):
        build_world(data, base_dir=tmp_path)
