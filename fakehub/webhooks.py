"""Webhook events: payloads built from fakehub's state and completed against GitHub's webhook
schemas, signed with the App's secret, POSTed to its webhook URL and recorded as deliveries."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from fakehub import schema, shapes
from fakehub.world import CheckRun, Comment, Delivery, Pull, World, timestamp

TIMEOUT = 10.0  # seconds, as GitHub waits


def signature(secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 value: HMAC-SHA256 of the raw body, hex."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def schema_name(event: str, action: str | None) -> str:
    parts = [event] + ([action] if action else [])
    return "webhook-" + "-".join(p.replace("_", "-") for p in parts)


@functools.cache
def _completer() -> schema.Completer:
    return schema.Completer(schema.load_document(schema.WEBHOOK_SCHEMAS))


def complete(event: str, action: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema_name(event, action)}"}
    done: dict[str, Any] = _completer().complete(ref, payload)
    return done


def _common(world: World, repo_name: str, sender: str, api: str) -> dict[str, Any]:
    repo = world.repos[repo_name]
    payload: dict[str, Any] = {
        "repository": shapes.repository(world, repo, api),
        "sender": shapes.user(world, sender, api),
    }
    inst = world.installation_for(repo)
    if inst is not None:
        payload["installation"] = {
            "id": inst.id,
            "node_id": shapes.node_id("Installation", inst.id),
        }
    return payload


def pull_request_event(
    world: World,
    pr: Pull,
    action: str,
    sender: str,
    api: str,
    *,
    label: str | None = None,
    before: str | None = None,
) -> dict[str, Any]:
    payload = {
        "action": action,
        "number": pr.number,
        "pull_request": shapes.pull(world, pr, api),
        **_common(world, pr.repo, sender, api),
    }
    if label is not None:
        payload["label"] = shapes.label(world, world.repos[pr.repo], label, api)
    if action == "synchronize":
        payload["before"] = before
        payload["after"] = pr.head_sha
    return complete("pull_request", action, payload)


def issue_comment_event(
    world: World,
    found: Comment,
    pr: Pull,
    api: str,
    *,
    sender: str | None = None,
    edited_from: str | None = None,
) -> dict[str, Any]:
    """`created`; with `edited_from` (the body before the edit), `edited` by `sender`."""
    action = "created" if edited_from is None else "edited"
    payload = {
        "action": action,
        "issue": shapes.issue_for_pull(world, pr, api),
        "comment": shapes.comment(world, found, api),
        **_common(world, pr.repo, sender or found.user, api),
    }
    if edited_from is not None:
        payload["changes"] = {"body": {"from": edited_from}}
    return complete("issue_comment", action, payload)


def check_run_event(
    world: World, run: CheckRun, action: str, sender: str, api: str, identifier: str | None = None
) -> dict[str, Any]:
    check_run = shapes.check_run(world, run, api)
    check_run["check_suite"] = shapes.check_suite(world, run, api)
    payload = {"action": action, "check_run": check_run, **_common(world, run.repo, sender, api)}
    if identifier is not None:
        payload["requested_action"] = {"identifier": identifier}
    return complete("check_run", action, payload)


def record(
    world: World,
    event: str,
    payload: dict[str, Any],
    redelivery: bool = False,
    guid: str | None = None,
) -> Delivery:
    """Record a delivery (callers hold the lock); `send` then POSTs it. A redelivery keeps the
    original's `guid` (and so its `X-GitHub-Delivery` header), as on GitHub."""
    found = Delivery(
        id=world.next_id(),
        guid=guid or str(uuid.uuid4()),
        event=event,
        action=payload.get("action"),
        payload=payload,
        installation_id=(payload.get("installation") or {}).get("id"),
        repository_id=(payload.get("repository") or {}).get("id"),
        delivered_at=timestamp(),
        redelivery=redelivery,
    )
    world.deliveries.append(found)
    return found


def send(world: World, found: Delivery) -> Delivery:
    """POST a recorded delivery to the App's webhook URL (without holding the lock) and store
    the outcome. Without a URL the delivery stays "not delivered"."""
    url, secret = world.app.webhook_url, world.app.webhook_secret
    if not url:
        return found
    body = json.dumps(found.payload).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/fakehub",
        "X-GitHub-Event": found.event,
        "X-GitHub-Delivery": found.guid,
        "X-GitHub-Hook-ID": str(world.app.id),
        "X-GitHub-Hook-Installation-Target-ID": str(world.app.id),
        "X-GitHub-Hook-Installation-Target-Type": "integration",
    }
    if secret:
        headers["X-Hub-Signature-256"] = signature(secret, body)
    started = time.monotonic()
    status, code = _post(url, body, headers)
    with world.lock:
        found.status, found.status_code = status, code
        found.duration = round(time.monotonic() - started, 3)
    return found


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[str, int]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return "OK", int(response.status)
    except urllib.error.HTTPError as exc:
        return f"Invalid HTTP Response: {exc.code}", int(exc.code)
    except (urllib.error.URLError, OSError) as exc:
        return f"failed to connect: {exc}", 0


def emit(world: World, event: str, payload: dict[str, Any]) -> Delivery | None:
    """Record and send one event if the App subscribes to it."""
    if event not in world.app.events:
        return None
    with world.lock:
        found = record(world, event, payload)
    return send(world, found)
