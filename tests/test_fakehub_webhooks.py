"""fakehub's webhooks: each control action delivers a signed event whose payload validates
against GitHub's webhook schema for that event and action; deliveries can be listed and
redelivered."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests

from fakehub import schema, webhooks
from fakehub.testing import Running, running
from fakehub.world import World, load_world

WORLD = Path(__file__).parent / "data" / "world-basic.yml"
SECRET = "fakehub-secret"


class Receiver:
    """A tiny webhook endpoint that keeps what it was sent."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/webhook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    thread = threading.Thread(target=found.server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
    thread.join()


@pytest.fixture
def hub(receiver: Receiver) -> Iterator[Running]:
    with running(load_world(WORLD), webhook_url=receiver.url) as found:
        yield found


def validate(event: str, action: str | None, payload: dict[str, Any]) -> list[dict[str, str]]:
    doc = schema.load_document(schema.WEBHOOK_SCHEMAS)
    ref = {"$ref": f"#/components/schemas/{webhooks.schema_name(event, action)}"}
    return schema.schema_errors(schema.validator_for(ref, root=doc), payload)


def control(hub: Running, method: str, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.request(method, f"{hub.url}/_fakehub{path}", json=body, timeout=10)


def bot_check_run(hub: Running) -> int:
    """A check run with an "approve" button on the fork PR, as gpuci would create it."""
    world = hub.world
    token = _token(hub)
    body: dict[str, Any] = {
        "name": "gpuci / batch 2",
        "head_sha": world.pulls[("acme/sample", 2)].head_sha,
        "status": "completed",
        "conclusion": "action_required",
        "output": {"title": "Approval needed", "summary": "fork"},
        "actions": [{"label": "Approve and run", "description": "Run", "identifier": "approve"}],
    }
    answer = requests.post(
        f"{hub.url}/repos/acme/sample/check-runs",
        json=body,
        headers={"Authorization": f"token {token}"},
        timeout=10,
    )
    run_id: int = answer.json()["id"]
    return run_id


def _token(hub: Running) -> str:
    now = int(time.time())
    assert hub.world.app.private_key_pem is not None
    encoded = jwt.encode(
        {"iat": now - 30, "exp": now + 300, "iss": str(hub.world.app.id)},
        hub.world.app.private_key_pem,
        algorithm="RS256",
    )
    answer = requests.post(
        f"{hub.url}/app/installations/101/access_tokens",
        headers={"Authorization": f"Bearer {encoded}"},
        timeout=10,
    )
    token: str = answer.json()["token"]
    return token


def _open(hub: Running) -> requests.Response:
    body = {
        "repo": "acme/sample",
        "head": {"repo": "acme/sample", "ref": "more", "files": {"x.py": "x = 1\n"}},
        "author": "alice",
        "title": "More",
    }
    return control(hub, "POST", "/pulls", body)


def _edit(hub: Running) -> requests.Response:
    made = control(hub, "POST", "/pulls/acme/sample/2/comments", {"user": "bob", "body": "hi"})
    comment_id = made.json()["comment"]["id"]
    return control(hub, "PATCH", f"/comments/{comment_id}", {"body": "/gpuci run all"})


def _label_after_the_fork_is_deleted(hub: Running) -> requests.Response:
    assert control(hub, "POST", "/repos/outsider/sample/delete", {}).status_code == 200
    body = {"user": "carol", "add": "gpuci/approved"}
    return control(hub, "POST", "/pulls/acme/sample/2/labels", body)


# action name -> (do it, event, action, sender)
ACTIONS: dict[str, tuple[Any, str, str, str]] = {
    "comment_edited": (_edit, "issue_comment", "edited", "bob"),
    "labeled_head_repo_deleted": (
        _label_after_the_fork_is_deleted,
        "pull_request",
        "labeled",
        "carol",
    ),
    "opened": (_open, "pull_request", "opened", "alice"),
    "synchronize": (
        lambda h: control(h, "POST", "/pulls/acme/sample/1/push", {"files": {"a": "b"}}),
        "pull_request",
        "synchronize",
        "alice",
    ),
    "closed": (
        lambda h: control(h, "POST", "/pulls/acme/sample/2/close", {"user": "outsider"}),
        "pull_request",
        "closed",
        "outsider",
    ),
    "labeled": (
        lambda h: control(
            h, "POST", "/pulls/acme/sample/2/labels", {"user": "carol", "add": "gpuci/approved"}
        ),
        "pull_request",
        "labeled",
        "carol",
    ),
    "comment": (
        lambda h: control(
            h, "POST", "/pulls/acme/sample/2/comments", {"user": "bob", "body": "/gpuci run all"}
        ),
        "issue_comment",
        "created",
        "bob",
    ),
    "requested_action": (
        lambda h: control(
            h,
            "POST",
            f"/check-runs/{bot_check_run(h)}/requested-action",
            {"user": "alice", "identifier": "approve"},
        ),
        "check_run",
        "requested_action",
        "alice",
    ),
    "rerequested": (
        lambda h: control(
            h, "POST", f"/check-runs/{bot_check_run(h)}/rerequest", {"user": "alice"}
        ),
        "check_run",
        "rerequested",
        "alice",
    ),
}


@pytest.mark.parametrize("name", list(ACTIONS))
def test_control_actions_deliver_signed_schema_valid_webhooks(
    hub: Running, receiver: Receiver, name: str
) -> None:
    act, event, action, sender = ACTIONS[name]
    answer = act(hub)
    assert answer.status_code in (200, 201), answer.text
    headers, body = receiver.received[-1]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["x-hub-signature-256"] == expected
    assert headers["x-github-event"] == event
    assert len(headers["x-github-delivery"]) == 36
    payload = json.loads(body)
    assert payload["action"] == action
    assert payload["sender"]["login"] == sender
    assert payload["installation"]["id"] == 101
    assert validate(event, action, payload) == []
    assert answer.json()["delivery"]["status_code"] == 202


def test_an_edited_comment_carries_the_new_body_and_the_old_one(
    hub: Running, receiver: Receiver
) -> None:
    made = control(hub, "POST", "/pulls/acme/sample/2/comments", {"user": "bob", "body": "v1"})
    comment_id = made.json()["comment"]["id"]
    edited = control(hub, "PATCH", f"/comments/{comment_id}", {"body": "v2"})
    assert edited.status_code == 200, edited.text
    payload = json.loads(receiver.received[-1][1])
    assert (payload["action"], payload["comment"]["body"]) == ("edited", "v2")
    assert payload["changes"] == {"body": {"from": "v1"}}
    assert payload["comment"]["id"] == comment_id
    assert payload["comment"]["updated_at"] >= payload["comment"]["created_at"]
    by_another = control(hub, "PATCH", f"/comments/{comment_id}", {"user": "carol", "body": "x"})
    assert by_another.status_code == 403  # carol has triage: only write+ edits others' comments
    assert control(hub, "PATCH", "/comments/1", {"body": "x"}).status_code == 404
    assert len(receiver.received) == 2


def test_a_deleted_head_repository_leaves_its_pull_open_with_no_head_repo(
    hub: Running, receiver: Receiver
) -> None:
    deleted = control(hub, "POST", "/repos/outsider/sample/delete", {})
    assert deleted.json() == {"deleted": "outsider/sample", "pulls": ["acme/sample#2"]}
    assert receiver.received == []  # GitHub tells the base repository's App nothing
    headers = {"Authorization": f"token {_token(hub)}"}
    pull = requests.get(f"{hub.url}/repos/acme/sample/pulls/2", headers=headers, timeout=10)
    assert pull.status_code == 200
    head = pull.json()["head"]
    assert head["repo"] is None and head["sha"] == hub.world.pulls[("acme/sample", 2)].head_sha
    assert pull.json()["state"] == "open"
    gone = requests.get(f"{hub.url}/repos/outsider/sample", headers=headers, timeout=10)
    assert gone.status_code == 404
    tarball = requests.get(
        f"{hub.url}/repos/acme/sample/tarball/{head['sha']}", headers=headers, timeout=10
    )
    assert tarball.status_code == 200  # the base repository still serves the PR's commit
    pushed = control(hub, "POST", "/pulls/acme/sample/2/push", {"files": {"a": "b"}})
    assert pushed.status_code == 422 and "deleted" in pushed.json()["message"]
    again = control(hub, "POST", "/repos/outsider/sample/delete", {})
    assert again.status_code == 400
    base = control(hub, "POST", "/repos/acme/sample/delete", {})
    assert base.status_code == 400 and "base repository" in base.json()["message"]


def test_every_github_request_is_in_the_request_log(hub: Running) -> None:
    token = _token(hub)
    headers = {"Authorization": f"token {token}"}
    requests.get(f"{hub.url}/repos/acme/sample/pulls/1", headers=headers, timeout=10)
    requests.get(f"{hub.url}/repos/acme/sample/nothing-here", headers=headers, timeout=10)
    control(hub, "POST", "/pulls/acme/sample/1/close", {})
    logged = requests.get(f"{hub.url}/_fakehub/requests", timeout=10).json()["requests"]
    assert [(r["method"], r["operation"], r["status"]) for r in logged] == [
        ("POST", "apps/create-installation-access-token", 201),
        ("GET", "pulls/get", 200),
        ("GET", None, 404),
    ]
    assert logged[1]["path"] == "/repos/acme/sample/pulls/1"
    assert requests.delete(f"{hub.url}/_fakehub/requests", timeout=10).json() == {"requests": []}
    assert requests.get(f"{hub.url}/_fakehub/requests", timeout=10).json() == {"requests": []}


def test_synchronize_carries_the_new_head_and_the_old_one(hub: Running, receiver: Receiver) -> None:
    before = hub.world.pulls[("acme/sample", 1)].head_sha
    after = control(hub, "POST", "/pulls/acme/sample/1/push", {}).json()["sha"]
    payload = json.loads(receiver.received[-1][1])
    assert (payload["before"], payload["after"]) == (before, after)
    assert payload["pull_request"]["head"]["sha"] == after


def test_unlabel_by_a_user_and_by_the_bot(hub: Running, receiver: Receiver) -> None:
    control(hub, "POST", "/pulls/acme/sample/1/labels", {"user": "alice", "add": "gpuci/approved"})
    control(
        hub, "POST", "/pulls/acme/sample/1/labels", {"user": "alice", "remove": "gpuci/approved"}
    )
    payload = json.loads(receiver.received[-1][1])
    assert (payload["action"], payload["label"]["name"]) == ("unlabeled", "gpuci/approved")
    assert validate("pull_request", "unlabeled", payload) == []
    control(hub, "POST", "/pulls/acme/sample/1/labels", {"user": "alice", "add": "gpuci/approved"})
    requests.delete(
        f"{hub.url}/repos/acme/sample/issues/1/labels/gpuci/approved",
        headers={"Authorization": f"token {_token(hub)}"},
        timeout=10,
    )
    payload = json.loads(receiver.received[-1][1])
    assert payload["action"] == "unlabeled"
    assert payload["sender"]["login"] == "gpuci[bot]"
    assert payload["sender"]["type"] == "Bot"
    assert validate("pull_request", "unlabeled", payload) == []


def test_users_without_triage_cannot_label(hub: Running, receiver: Receiver) -> None:
    answer = control(hub, "POST", "/pulls/acme/sample/1/labels", {"user": "bob", "add": "x"})
    assert answer.status_code == 403
    assert receiver.received == []


def test_bot_comments_are_delivered_as_the_bot(hub: Running, receiver: Receiver) -> None:
    requests.post(
        f"{hub.url}/repos/acme/sample/issues/1/comments",
        json={"body": "queued"},
        headers={"Authorization": f"token {_token(hub)}"},
        timeout=10,
    )
    payload = json.loads(receiver.received[-1][1])
    assert payload["comment"]["user"]["login"] == "gpuci[bot]"
    assert payload["issue"]["pull_request"]["url"].endswith("/repos/acme/sample/pulls/1")
    assert validate("issue_comment", "created", payload) == []


def test_requested_action_needs_an_offered_identifier(hub: Running, receiver: Receiver) -> None:
    run_id = bot_check_run(hub)
    body = {"user": "alice", "identifier": "launch"}
    answer = control(hub, "POST", f"/check-runs/{run_id}/requested-action", body)
    assert answer.status_code == 422
    assert receiver.received == []


def test_deliveries_are_listed_and_redelivered(hub: Running, receiver: Receiver) -> None:
    control(hub, "POST", "/pulls/acme/sample/2/comments", {"user": "bob", "body": "hello"})
    bearer = {"Authorization": f"Bearer {_jwt(hub.world)}"}
    listed = requests.get(f"{hub.url}/app/hook/deliveries", headers=bearer, timeout=10).json()
    assert [(d["event"], d["action"], d["status_code"]) for d in listed] == [
        ("issue_comment", "created", 202)
    ]
    redo = requests.post(
        f"{hub.url}/app/hook/deliveries/{listed[0]['id']}/attempts", headers=bearer, timeout=10
    )
    assert redo.status_code == 202
    assert len(receiver.received) == 2
    assert receiver.received[0][1] == receiver.received[1][1]
    again = requests.get(f"{hub.url}/app/hook/deliveries", headers=bearer, timeout=10).json()
    assert [d["redelivery"] for d in again] == [True, False]
    state = requests.get(f"{hub.url}/_fakehub/state", timeout=10).json()
    assert state["deliveries"][0]["payload"]["comment"]["body"] == "hello"


def _jwt(world: World) -> str:
    now = int(time.time())
    assert world.app.private_key_pem is not None
    payload = {"iat": now - 30, "exp": now + 300, "iss": str(world.app.id)}
    return jwt.encode(payload, world.app.private_key_pem, algorithm="RS256")


def test_without_a_webhook_url_deliveries_are_recorded_not_delivered() -> None:
    with running(load_world(WORLD)) as hub:
        answer = control(hub, "POST", "/pulls/acme/sample/1/close", {})
        assert answer.json()["delivery"]["status"] == "not delivered"
        (found,) = hub.world.deliveries
        assert (found.event, found.action) == ("pull_request", "closed")


def test_a_failing_receiver_is_recorded(hub: Running) -> None:
    hub.world.app.webhook_url = "http://127.0.0.1:9/nothing-listens-here"
    answer = control(hub, "POST", "/pulls/acme/sample/1/close", {})
    assert answer.json()["delivery"]["status"].startswith("failed to connect")
