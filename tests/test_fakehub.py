"""fakehub through real HTTP: PyGithub against it, every response checked against GitHub's REST
description, request validation, App JWT and installation-token authentication."""

from __future__ import annotations

import io
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from github import Auth, Github, GithubException, GithubIntegration

from fakehub import description, schema
from fakehub.testing import Running, running
from fakehub.world import World, load_world

WORLD = Path(__file__).parent / "data" / "world-basic.yml"
# PyGithub waits 0.25 s between requests and 1 s between writes by default.
NO_THROTTLE: dict[str, Any] = {"seconds_between_requests": 0, "seconds_between_writes": 0}


@pytest.fixture
def world() -> World:
    return load_world(WORLD)


@pytest.fixture
def hub(world: World) -> Iterator[Running]:
    with running(world) as found:
        yield found


def app_jwt(world: World, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iat": now - 30, "exp": now + 300, "iss": str(world.app.id), **claims}
    assert world.app.private_key_pem is not None
    return jwt.encode(payload, world.app.private_key_pem, algorithm="RS256")


def new_token(hub: Running, **body: Any) -> str:
    answer = requests.post(
        f"{hub.url}/app/installations/101/access_tokens",
        json=body,
        headers={"Authorization": f"Bearer {app_jwt(hub.world)}"},
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    token: str = answer.json()["token"]
    return token


@pytest.fixture
def token(hub: Running) -> str:
    return new_token(hub)


@pytest.fixture
def gh(hub: Running) -> Github:
    """PyGithub as gpuci uses it: App key -> installation token -> client at base_url."""
    key = hub.world.app.private_key_pem
    assert key is not None
    integration = GithubIntegration(
        auth=Auth.AppAuth(hub.world.app.id, key.decode()), base_url=hub.url, **NO_THROTTLE
    )
    installation = integration.get_repo_installation("acme", "sample")
    access = integration.get_access_token(installation.id)
    return Github(auth=Auth.Token(access.token), base_url=hub.url, **NO_THROTTLE)


def call(hub: Running, method: str, path: str, token: str | None, **kw: Any) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(method, hub.url + path, headers=headers, timeout=10, **kw)


def head_sha(world: World, number: int) -> str:
    return world.pulls[("acme/sample", number)].head_sha


# ------------------------------------------------------------------------------ PyGithub


def test_pygithub_reads_files_from_the_default_branch_and_a_ref(gh: Github, world: World) -> None:
    repo = gh.get_repo("acme/sample")
    assert repo.default_branch == "main"
    config = repo.get_contents(".gpuci.yml")
    assert not isinstance(config, list)
    assert b"approval_label: gpuci/approved" in config.decoded_content
    at_head = repo.get_contents("tests/test_math.py", ref=head_sha(world, 1))
    assert not isinstance(at_head, list)
    assert b"2 + 2 == 4" in at_head.decoded_content
    with pytest.raises(GithubException) as missing:
        repo.get_contents("no/such/file.py")
    assert missing.value.status == 404


def test_pygithub_pull_request_heads(gh: Github, world: World) -> None:
    repo = gh.get_repo("acme/sample")
    same_repo, fork = repo.get_pull(1), repo.get_pull(2)
    assert same_repo.head.sha == head_sha(world, 1)
    assert same_repo.head.repo.full_name == same_repo.base.repo.full_name == "acme/sample"
    assert fork.head.repo.full_name == "outsider/sample"
    assert fork.user.login == "outsider"
    assert same_repo.head.sha != fork.head.sha


@pytest.mark.parametrize(
    ("login", "permission", "role"),
    [
        ("alice", "admin", "admin"),
        ("carol", "read", "triage"),
        ("bob", "read", "read"),
        ("outsider", "none", "none"),
    ],
)
def test_pygithub_collaborator_permission(
    gh: Github, login: str, permission: str, role: str
) -> None:
    repo = gh.get_repo("acme/sample")
    assert repo.get_collaborator_permission(login) == permission
    assert repo.get_collaborator_role_name(login) == role


def test_permission_change_through_the_control_api(gh: Github, hub: Running) -> None:
    answer = requests.put(
        f"{hub.url}/_fakehub/permissions",
        json={"repo": "acme/sample", "user": "bob", "role": "maintain"},
        timeout=10,
    )
    assert answer.status_code == 200
    repo = gh.get_repo("acme/sample")
    assert repo.get_collaborator_role_name("bob") == "maintain"
    assert repo.get_collaborator_permission("bob") == "write"


def test_pygithub_check_run_lifecycle_is_recorded(gh: Github, hub: Running) -> None:
    repo = gh.get_repo("acme/sample")
    sha = head_sha(hub.world, 1)
    run = repo.create_check_run(
        name="gpuci / batch 2",
        head_sha=sha,
        status="completed",
        conclusion="action_required",
        output={"title": "Needs approval", "summary": "fork"},
        actions=[{"label": "Approve and run", "description": "run it", "identifier": "approve"}],
    )
    assert run.conclusion == "action_required"
    assert [pr.number for pr in run.pull_requests] == [1]
    run.edit(status="in_progress")
    run.edit(conclusion="success", output={"title": "2 passed", "summary": "ok"})
    assert repo.get_check_run(run.id).conclusion == "success"
    listed = list(repo.get_commit(sha).get_check_runs())
    assert [c.id for c in listed] == [run.id]
    state = requests.get(f"{hub.url}/_fakehub/state", timeout=10).json()
    (recorded,) = state["check_runs"]
    assert [h["action"] for h in recorded["history"]] == ["created", "updated", "updated"]
    assert recorded["history"][1]["request"] == {"status": "in_progress"}
    assert recorded["fields"]["output"]["title"] == "2 passed"


def test_check_runs_for_a_fork_head_list_no_pull_requests(gh: Github, world: World) -> None:
    run = gh.get_repo("acme/sample").create_check_run(name="x", head_sha=head_sha(world, 2))
    assert run.pull_requests == []
    assert run.status == "queued"


def test_pygithub_comments_reactions_and_labels(gh: Github, hub: Running) -> None:
    pr = gh.get_repo("acme/sample").get_pull(1)
    comment = pr.create_issue_comment("gpuci: queued batch 2")
    assert comment.user.login == "gpuci[bot]"
    assert comment.create_reaction("eyes").content == "eyes"
    pr.add_to_labels("gpuci/approved")
    assert [label.name for label in pr.get_labels()] == ["gpuci/approved"]
    pr.remove_from_labels("gpuci/approved")
    assert list(pr.get_labels()) == []
    with pytest.raises(GithubException) as missing:
        pr.remove_from_labels("gpuci/approved")
    assert missing.value.status == 404
    (stored,) = hub.world.comments.values()
    assert [(r.user, r.content) for r in stored.reactions] == [("gpuci[bot]", "eyes")]


def test_archive_link_serves_the_commit_as_a_tarball(gh: Github, world: World) -> None:
    sha = head_sha(world, 1)
    link = gh.get_repo("acme/sample").get_archive_link("tarball", sha)
    with urllib.request.urlopen(link, timeout=10) as answer:
        files = _untar(answer.read())
    top = f"acme-sample-{sha[:7]}"
    assert files[f"{top}/tests/test_math.py"] == b"def test_add():\n    assert 2 + 2 == 4\n"
    assert f"{top}/.gpuci.yml" in files
    forged = link.rsplit("token=", 1)[0] + "token=1.abc"
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(forged, timeout=10)


def _untar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_push_makes_a_new_commit_whose_tarball_has_the_new_files(gh: Github, hub: Running) -> None:
    old = head_sha(hub.world, 1)
    answer = requests.post(
        f"{hub.url}/_fakehub/pulls/acme/sample/1/push",
        json={"files": {"tests/test_new.py": "def test_new():\n    pass\n", "README.md": None}},
        timeout=10,
    )
    new = answer.json()["sha"]
    assert len(new) == 40 and new != old
    repo = gh.get_repo("acme/sample")
    assert repo.get_pull(1).head.sha == new
    assert repo.get_commit(new).parents[0].sha == old
    with urllib.request.urlopen(repo.get_archive_link("tarball", new), timeout=10) as got:
        files = _untar(got.read())
    top = f"acme-sample-{new[:7]}"
    assert f"{top}/tests/test_new.py" in files
    assert f"{top}/README.md" not in files
    with urllib.request.urlopen(repo.get_archive_link("tarball", old), timeout=10) as got:
        assert f"acme-sample-{old[:7]}/README.md" in _untar(got.read())


def test_a_push_to_the_default_branch_moves_its_head(gh: Github, hub: Running) -> None:
    old = hub.world.repos["acme/sample"].branches["main"]
    url = f"{hub.url}/_fakehub/repos/acme/sample/branches/main/push"
    user = next(iter(hub.world.users))
    answer = requests.post(url, json={"user": user, "files": {"NEW.md": "x\n"}}, timeout=10)

    new = answer.json()["sha"]
    repo = gh.get_repo("acme/sample")
    assert repo.get_branch("main").commit.sha == new != old
    assert repo.get_commit(new).parents[0].sha == old
    assert repo.get_contents("NEW.md", ref="main").decoded_content == b"x\n"  # type: ignore[union-attr]
    missing = requests.post(url.replace("/main/", "/nope/"), json={"user": user}, timeout=10)
    assert missing.status_code == 400 and "no branch 'nope'" in missing.json()["message"]
    bad = requests.post(url, json={"user": user, "files": ["x"]}, timeout=10)
    assert bad.status_code == 400 and "'files' must map paths" in bad.json()["message"]


def test_commits_and_branches(gh: Github, world: World) -> None:
    repo = gh.get_repo("acme/sample")
    main = repo.get_branch("main")
    assert main.commit.sha == world.repos["acme/sample"].branches["main"]
    assert repo.get_commit("feature").sha == head_sha(world, 1)
    with pytest.raises(GithubException) as missing:
        repo.get_branch("nope")
    assert missing.value.status == 404


# ------------------------------------------------------------------------------ responses


def _cases(world: World) -> list[tuple[str, str, Any, int]]:
    sha = head_sha(world, 1)
    return [
        ("GET", "/repos/acme/sample", None, 200),
        ("GET", "/repos/acme/sample/branches/main", None, 200),
        ("GET", f"/repos/acme/sample/commits/{sha}", None, 200),
        ("GET", "/repos/acme/sample/contents/.gpuci.yml?ref=main", None, 200),
        ("GET", "/repos/acme/sample/contents/tests", None, 200),
        ("GET", "/repos/acme/sample/collaborators/carol/permission", None, 200),
        ("GET", "/repos/acme/sample/pulls/2", None, 200),
        ("POST", "/repos/acme/sample/check-runs", {"name": "a", "head_sha": sha}, 201),
        ("GET", "/repos/acme/sample/check-runs/{run}", None, 200),
        ("PATCH", "/repos/acme/sample/check-runs/{run}", {"status": "in_progress"}, 200),
        ("GET", f"/repos/acme/sample/commits/{sha}/check-runs", None, 200),
        ("POST", "/repos/acme/sample/issues/1/comments", {"body": "hi"}, 201),
        ("POST", "/repos/acme/sample/issues/comments/{comment}/reactions", {"content": "+1"}, 201),
        ("POST", "/repos/acme/sample/issues/1/labels", {"labels": ["a", "b"]}, 200),
        ("GET", "/repos/acme/sample/issues/1/labels", None, 200),
        ("DELETE", "/repos/acme/sample/issues/1/labels/a", None, 200),
        ("GET", f"/repos/acme/sample/tarball/{sha}", None, 302),
        ("GET", "/orgs/acme/members/alice", None, 204),
        ("GET", "/orgs/acme/members/bob", None, 404),
    ]


_APP_CASES = [
    ("GET", "/app", None, 200),
    ("GET", "/repos/acme/sample/installation", None, 200),
    ("POST", "/app/installations/101/access_tokens", {"repositories": ["sample"]}, 201),
    ("GET", "/app/hook/deliveries", None, 200),
    ("POST", "/app/hook/deliveries/{delivery}/attempts", None, 202),
]


def test_every_operation_answers_as_the_description_says(hub: Running, token: str) -> None:
    """Each endpoint's answer validates against its response schema, and the table covers every
    operation in GitHub's description."""
    ids: dict[str, Any] = {}
    covered = set()
    bearer = {"Authorization": f"Bearer {app_jwt(hub.world)}"}
    for method, template, body, status in _cases(hub.world) + _APP_CASES:
        path = template.format(**ids)
        headers = bearer if (method, template, body, status) in _APP_CASES else None
        answer = requests.request(
            method,
            hub.url + path,
            json=body,
            headers=headers or {"Authorization": f"token {token}"},
            timeout=10,
            allow_redirects=False,
        )
        assert answer.status_code == status, (method, path, answer.text)
        found = description.match(method, path.split("?")[0])
        assert found is not None
        op = found[0]
        covered.add(op.operation_id)
        response_schema = op.response_schema(status)
        if response_schema is not None:
            errors = schema.schema_errors(schema.validator_for(response_schema), answer.json())
            assert errors == [], (op.operation_id, errors[:3])
        if op.operation_id == "checks/create":
            ids["run"] = answer.json()["id"]
        if op.operation_id == "issues/create-comment":
            ids["comment"] = answer.json()["id"]
            ids["delivery"] = hub.world.deliveries[-1].id
        if op.operation_id == "repos/download-tarball-archive":
            assert "/_fakehub/codeload/acme/sample/" in answer.headers["Location"]
    assert covered == {op.operation_id for op in description.operations()}


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        (
            "POST",
            "/repos/acme/sample/check-runs",
            {"name": "x", "head_sha": "{sha}", "status": "done"},
            "status",
        ),
        ("POST", "/repos/acme/sample/check-runs", {"head_sha": "{sha}"}, "name"),
        (
            "POST",
            "/repos/acme/sample/check-runs",
            {"name": "x", "head_sha": "{sha}", "status": "completed"},
            "conclusion",
        ),
        ("POST", "/repos/acme/sample/check-runs", {"name": "x", "head_sha": "0" * 40}, "head_sha"),
        (
            "POST",
            "/repos/acme/sample/check-runs",
            {"name": "x", "head_sha": "{sha}", "output": {"title": "t"}},
            "output.summary",
        ),
        ("POST", "/repos/acme/sample/issues/1/comments", {"text": "hi"}, "body"),
        ("POST", "/repos/acme/sample/issues/1/labels", {"labels": []}, "labels"),
        ("POST", "/repos/acme/sample/issues/comments/1/reactions", {"content": "tada"}, "content"),
        ("GET", "/repos/acme/sample/pulls/one", None, "pull_number"),
        ("GET", "/repos/acme/sample/commits/{sha}/check-runs?status=done", None, "status"),
    ],
)
def test_requests_that_do_not_match_the_description_are_refused(
    hub: Running, token: str, method: str, path: str, body: Any, field: str
) -> None:
    sha = head_sha(hub.world, 1)
    if isinstance(body, dict) and body.get("head_sha") == "{sha}":
        body = {**body, "head_sha": sha}
    answer = call(hub, method, path.replace("{sha}", sha), token, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["message"] == "Validation Failed"
    assert field in [error["field"] for error in answer.json()["errors"]]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/repos/acme/sample/issues"), ("PUT", "/repos/acme/sample"), ("GET", "/nowhere")],
)
def test_unknown_endpoints_are_404(hub: Running, token: str, method: str, path: str) -> None:
    answer = call(hub, method, path, token)
    assert answer.status_code == 404
    assert answer.json()["message"] == "Not Found"


# ------------------------------------------------------------------------------ authentication


def _other_key() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"iat": -700, "exp": -100}, "Expiration time"),
        ({"iat": 120, "exp": 400}, "Issued at"),
        ({"iat": -10, "exp": 900}, "too far in the future"),
        ({"iss": "999"}, "Issuer"),
        ({"key": "other"}, "could not be decoded"),
    ],
)
def test_bad_app_jwts_are_401(hub: Running, claims: dict[str, Any], message: str) -> None:
    now = int(time.time())
    payload = {"iat": now - 30, "exp": now + 300, "iss": str(hub.world.app.id)}
    for name in ("iat", "exp"):
        if name in claims:
            payload[name] = now + claims[name]
    if "iss" in claims:
        payload["iss"] = claims["iss"]
    key = _other_key() if "key" in claims else hub.world.app.private_key_pem
    encoded = jwt.encode(payload, key, algorithm="RS256")  # type: ignore[arg-type]
    answer = requests.get(
        f"{hub.url}/app", headers={"Authorization": f"Bearer {encoded}"}, timeout=10
    )
    assert answer.status_code == 401
    assert message in answer.json()["message"]


def test_a_good_jwt_reads_the_app(hub: Running) -> None:
    encoded = app_jwt(hub.world)
    answer = requests.get(
        f"{hub.url}/app", headers={"Authorization": f"Bearer {encoded}"}, timeout=10
    )
    assert answer.status_code == 200
    assert answer.json()["slug"] == "gpuci"


def test_repo_endpoints_refuse_missing_unknown_and_expired_tokens(hub: Running, token: str) -> None:
    assert call(hub, "GET", "/repos/acme/sample", None).status_code == 401
    assert call(hub, "GET", "/repos/acme/sample", "ghs_made_up").status_code == 401
    assert call(hub, "GET", "/repos/acme/sample", app_jwt(hub.world)).status_code == 401
    assert call(hub, "GET", "/repos/acme/sample", token).status_code == 200
    hub.world.tokens[token].expires_at = datetime.now(UTC) - timedelta(seconds=1)
    assert call(hub, "GET", "/repos/acme/sample", token).status_code == 401


def test_installation_token_expires_in_an_hour(hub: Running) -> None:
    answer = requests.post(
        f"{hub.url}/app/installations/101/access_tokens",
        headers={"Authorization": f"Bearer {app_jwt(hub.world)}"},
        timeout=10,
    )
    expires = datetime.fromisoformat(answer.json()["expires_at"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < expires - datetime.now(UTC) <= timedelta(hours=1)
    assert answer.json()["token"].startswith("ghs_")


def test_a_contents_read_token_cannot_write_check_runs(hub: Running) -> None:
    """The worker's token: one repository, contents:read only."""
    token = new_token(hub, repositories=["sample"], permissions={"contents": "read"})
    sha = head_sha(hub.world, 1)
    assert (
        call(
            hub, "GET", f"/repos/acme/sample/tarball/{sha}", token, allow_redirects=False
        ).status_code
        == 302
    )
    created = call(
        hub, "POST", "/repos/acme/sample/check-runs", token, json={"name": "x", "head_sha": sha}
    )
    assert created.status_code == 403
    assert created.json()["message"] == "Resource not accessible by integration"
    commented = call(hub, "POST", "/repos/acme/sample/issues/1/comments", token, json={"body": "x"})
    assert commented.status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {"permissions": {"contents": "write"}},
        {"repositories": ["elsewhere"]},
        {"repository_ids": [1]},
    ],
)
def test_tokens_cannot_exceed_the_installation(hub: Running, body: dict[str, Any]) -> None:
    answer = requests.post(
        f"{hub.url}/app/installations/101/access_tokens",
        json=body,
        headers={"Authorization": f"Bearer {app_jwt(hub.world)}"},
        timeout=10,
    )
    assert answer.status_code == 422


def test_installation_of_a_repo_without_the_app_is_404(hub: Running) -> None:
    answer = requests.get(
        f"{hub.url}/repos/outsider/sample/installation",
        headers={"Authorization": f"Bearer {app_jwt(hub.world)}"},
        timeout=10,
    )
    assert answer.status_code == 404


# ------------------------------------------------------------------------------ faults


def test_injected_faults_fail_the_next_matching_requests(hub: Running, token: str) -> None:
    requests.post(
        f"{hub.url}/_fakehub/faults",
        json={"path": "/repos/*/pulls/*", "status": 502, "count": 2},
        timeout=10,
    )
    requests.post(
        f"{hub.url}/_fakehub/faults",
        json={"path": "/repos/acme/sample", "status": 429, "retry_after": 7},
        timeout=10,
    )
    statuses = [call(hub, "GET", "/repos/acme/sample/pulls/1", token).status_code for _ in range(3)]
    assert statuses == [502, 502, 200]
    limited = call(hub, "GET", "/repos/acme/sample", token)
    assert (limited.status_code, limited.headers["Retry-After"]) == (429, "7")
    assert call(hub, "GET", "/repos/acme/sample", token).status_code == 200


def test_secondary_rate_limit_fault(hub: Running, token: str) -> None:
    requests.post(
        f"{hub.url}/_fakehub/faults",
        json={"path": "/repos/*/check-runs", "method": "POST", "status": 403, "retry_after": 1},
        timeout=10,
    )
    sha = head_sha(hub.world, 1)
    body = {"name": "x", "head_sha": sha}
    refused = call(hub, "POST", "/repos/acme/sample/check-runs", token, json=body)
    assert refused.status_code == 403
    assert "secondary rate limit" in refused.json()["message"]
    assert call(hub, "POST", "/repos/acme/sample/check-runs", token, json=body).status_code == 201
