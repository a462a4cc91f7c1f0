"""GitHubApp against fakehub over HTTP: tokens, scoped source tokens, retries without duplicates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from github import GithubException

from bot import cli
from bot.github_app import GitHubApp, GitHubAppError, app_retry
from contract.settings import Settings
from fakehub.testing import Running, running
from fakehub.world import World, load_world
from tests.conftest import EVENTS_WORLD

REPO = "acme/gpu"
INSTALLATION = 201


@pytest.fixture
def world() -> World:
    return load_world(EVENTS_WORLD)


@pytest.fixture
def hub(world: World) -> Iterator[Running]:
    with running(world) as found:
        yield found


@pytest.fixture
def app(hub: Running) -> GitHubApp:
    pem = hub.world.app.private_key_pem
    assert pem is not None
    retry = app_retry(backoff_factor=0.05, max_wait_s=5)
    return GitHubApp(hub.url, hub.world.app.id, pem.decode(), retry=retry, write_interval_s=0)


def state(hub: Running) -> Any:
    return requests.get(f"{hub.url}/_fakehub/state", timeout=10).json()


def fault(hub: Running, **body: Any) -> None:
    answer = requests.post(f"{hub.url}/_fakehub/faults", json=body, timeout=10)
    assert answer.status_code == 201, answer.text


def head_sha(hub: Running) -> str:
    return str(state(hub)["repos"][REPO]["branches"]["main"])


def check_body(hub: Running, external_id: str = "r1") -> dict[str, Any]:
    return {"name": "gpuci / batch 2", "head_sha": head_sha(hub), "external_id": external_id}


def test_installation_token_is_minted_once_and_reused(app: GitHubApp, hub: Running) -> None:
    repo = app.repo(INSTALLATION, REPO)
    assert "batches:" in (repo.file_text(".gpuci.yml", "main") or "")
    assert repo.role_of("wendy") == ("write", "write")
    assert app.repo(INSTALLATION, REPO).role_of("ossie") == ("none", "none")
    assert app.client(INSTALLATION) is app.client(INSTALLATION)
    tokens = [t for t in state(hub)["tokens"] if t["installation_id"] == INSTALLATION]
    assert len(tokens) == 1 and tokens[0]["repositories"] is None


def test_app_identity_and_installation_lookup(app: GitHubApp) -> None:
    assert app.bot_login == "gpuci[bot]"
    assert app.installation_for(REPO) == INSTALLATION
    assert app.installation_for("ACME/broken") == INSTALLATION


def test_source_token_reads_the_archive_and_nothing_else(app: GitHubApp, hub: Running) -> None:
    token = app.source_token(INSTALLATION, REPO)
    [issued] = [t for t in state(hub)["tokens"] if t["token_prefix"] == token[:8]]
    assert (issued["repositories"], issued["permissions"]) == ([REPO], {"contents": "read"})
    headers = {"Authorization": f"token {token}"}
    tarball = requests.get(f"{hub.url}/repos/{REPO}/tarball/main", headers=headers, timeout=10)
    assert tarball.status_code == 200 and tarball.content[:2] == b"\x1f\x8b"
    created = requests.post(
        f"{hub.url}/repos/{REPO}/check-runs", json=check_body(hub), headers=headers, timeout=10
    )
    assert created.status_code == 403
    other = requests.post(
        f"{hub.url}/repos/acme/broken/issues/1/comments", json={"body": "x"}, headers=headers,
        timeout=10,
    )  # fmt: skip
    assert other.status_code in (403, 404)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_reads_are_retried_on_server_errors(app: GitHubApp, hub: Running, status: int) -> None:
    repo = app.repo(INSTALLATION, REPO)
    repo.role_of("alice")  # the token exists: the faults hit the read itself
    fault(hub, path="/repos/*/contents/*", status=status, count=2)
    assert "batches:" in (repo.file_text(".gpuci.yml", "main") or "")
    assert state(hub)["faults"] == []


def test_check_run_create_answered_502_is_not_duplicated(app: GitHubApp, hub: Running) -> None:
    repo = app.repo(INSTALLATION, REPO)
    repo.role_of("alice")
    fault(hub, path="/repos/*/check-runs", method="POST", status=502, count=1)
    check_id = repo.create_check_run(check_body(hub))
    runs = state(hub)["check_runs"]
    assert [r["id"] for r in runs] == [check_id]


def test_a_comment_answered_500_is_not_sent_again(app: GitHubApp, hub: Running) -> None:
    repo = app.repo(INSTALLATION, REPO)
    repo.role_of("alice")
    requests.post(
        f"{hub.url}/_fakehub/pulls",
        json={"repo": REPO, "author": "alice", "head": {"ref": "feature"}},
        timeout=10,
    )
    fault(hub, path="/repos/*/issues/*/comments", method="POST", status=500, count=1)
    with pytest.raises(GithubException) as raised:
        repo.comment(1, "hello")
    assert raised.value.status == 500
    assert state(hub)["comments"] == []


def test_rate_limited_posts_are_sent_again_after_retry_after(app: GitHubApp, hub: Running) -> None:
    repo = app.repo(INSTALLATION, REPO)
    repo.role_of("alice")
    fault(hub, path="/repos/*/check-runs", method="POST", status=429, count=1, retry_after=1)
    fault(hub, path="/repos/*/check-runs", method="POST", status=403, count=1, retry_after=1)
    started = time.monotonic()
    repo.create_check_run(check_body(hub))
    assert time.monotonic() - started >= 2  # waited Retry-After twice
    assert len(state(hub)["check_runs"]) == 1


def test_a_far_rate_limit_reset_fails_instead_of_blocking(app: GitHubApp, hub: Running) -> None:
    repo = app.repo(INSTALLATION, REPO)
    repo.role_of("alice")
    fault(hub, path="/repos/*/contents/*", status=429, count=1)  # resets in 60 s
    started = time.monotonic()
    with pytest.raises(GithubException) as raised:
        repo.file_text(".gpuci.yml", "main")
    assert raised.value.status == 429
    assert time.monotonic() - started < 5


def test_missing_file_and_unknown_user_are_answers_not_errors(app: GitHubApp) -> None:
    repo = app.repo(INSTALLATION, REPO)
    assert repo.file_text("no/such/file.yml", "main") is None
    assert repo.role_of("nobody-at-all") == (None, None)


@pytest.mark.parametrize(
    ("app_id", "key", "message"),
    [
        ("", "key.pem", "GPUCI_APP_ID"),
        ("12x", "key.pem", "GPUCI_APP_ID"),
        ("42", "", "GPUCI_PRIVATE_KEY_PATH must name"),
        ("42", "missing.pem", "cannot read it"),
        ("42", "not-a-key.pem", "not a PEM private key"),
    ],
)
def test_settings_problems_are_named(tmp_path: Path, app_id: str, key: str, message: str) -> None:
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n")
    (tmp_path / "not-a-key.pem").write_text("hello\n")
    settings = Settings(app_id=app_id, private_key_path=str(tmp_path / key) if key else "")
    with pytest.raises(GitHubAppError, match=message):
        GitHubApp.from_settings(settings)


def test_gpuci_events_refuses_to_start_without_the_app_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUCI_APP_ID", raising=False)
    monkeypatch.delenv("GPUCI_PRIVATE_KEY_PATH", raising=False)
    assert cli.main(["events"]) == cli.EXIT_UNUSABLE
    assert "gpuci events: GPUCI_APP_ID must be" in capsys.readouterr().err


def test_source_token_is_reused_for_the_same_repository(app: GitHubApp, hub: Running) -> None:
    first = app.source_token(INSTALLATION, REPO)
    assert app.source_token(INSTALLATION, REPO) == first
    scoped = [t for t in state(hub)["tokens"] if t["repositories"] is not None]
    assert len(scoped) == 1
    assert scoped[0]["permissions"] == {"contents": "read"}
