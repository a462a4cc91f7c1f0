"""The fakehub Flask application: every GitHub request is matched to an operation of GitHub's
REST description, authenticated, validated, handled under the world's lock and answered with a
body completed to the operation's response schema."""

from __future__ import annotations

import fnmatch
import functools
import json
import secrets
import time
import uuid
from typing import Any

from flask import Flask, Response, current_app, request

from fakehub import api, auth, control, description, schema, webhooks
from fakehub.description import Operation, ValidationFailed
from fakehub.world import Delivery, World

EXTENSION = "fakehub"
RATE_LIMIT = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999"}

# Injected faults: status -> GitHub's message for it.
FAULT_MESSAGES = {
    500: "Server Error",
    502: "Server Error",
    503: "Service Unavailable",
    403: "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
    "again. If you reach out to GitHub Support for help, please include the request ID.",
    429: "API rate limit exceeded",
}


def create_app(
    world: World, *, webhook_url: str | None = None, webhook_secret: str | None = None
) -> Flask:
    """A fakehub serving `world`; the webhook URL and secret override the world file's."""
    if webhook_url is not None:
        world.app.webhook_url = webhook_url
    if webhook_secret is not None:
        world.app.webhook_secret = webhook_secret
    app = Flask(__name__)
    app.extensions[EXTENSION] = world
    app.config["FAKEHUB_LINK_SECRET"] = secrets.token_bytes(32)
    app.register_blueprint(control.blueprint)
    app.add_url_rule("/", "github_root", github, defaults={"path": ""}, methods=_METHODS)
    app.add_url_rule("/<path:path>", "github", github, methods=_METHODS)
    description.operations()  # load the description now: a missing file fails here, not later
    return app


_METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE"]


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    payload = b"" if body is None else json.dumps(body).encode()
    response = Response(payload, status=status, headers=headers or {})
    if body is not None:
        response.content_type = "application/json; charset=utf-8"
    return response


def error(status: int, message: str, **extra: Any) -> Response:
    return json_response(status, {"message": message, "documentation_url": api.DOCS, **extra})


def world_of(app: Any) -> World:
    found: World = app.extensions[EXTENSION]
    return found


def base_url() -> str:
    return request.host_url.rstrip("/")


def github(path: str) -> Response:
    """Answer one GitHub API request and add it to the world's request log."""
    world = world_of(current_app)
    found = description.match(request.method, "/" + path)
    response = _github(world, found, path)
    with world.lock:
        world.requests.append(
            {
                "method": request.method,
                "path": "/" + path,
                "operation": found[0].operation_id if found else None,
                "status": response.status_code,
            }
        )
    return response


def _github(world: World, found: tuple[Operation, dict[str, str]] | None, path: str) -> Response:
    if found is None:
        return error(404, "Not Found")
    op, raw_params = found
    fault = _take_fault(world, request.method, "/" + path)
    if fault is not None:
        return fault
    try:
        return _answer(world, op, raw_params)
    except auth.AuthError as exc:
        return error(exc.status, exc.message)
    except ValidationFailed as exc:
        return error(422, "Validation Failed", errors=_named(op, exc.errors))
    except api.NotFound as exc:
        return error(404, exc.message)


def _named(op: Operation, errors: list[dict[str, str]]) -> list[dict[str, str]]:
    resource = op.operation_id.split("/")[0]
    return [{"resource": resource, **e} for e in errors]


def _answer(world: World, op: Operation, raw_params: dict[str, str]) -> Response:
    access = _authenticate(world, op)
    params = description.validate_params(op, raw_params, request.args.to_dict())
    body = _body(op)
    description.validate_body(op, body)
    call = api.Call(
        world=world,
        op=op,
        params=params,
        body=body,
        api=base_url(),
        accept=request.headers.get("Accept", ""),
        access=access,
        link_secret=current_app.config["FAKEHUB_LINK_SECRET"],
    )
    with world.lock:
        if access.token is not None and "owner" in params:
            permission, level = auth.NEEDS[op.operation_id]
            auth.check_repo_access(world, access.token, call.repo, permission, level)
        status, result, headers = api.HANDLERS[op.operation_id](call)
        response = _render(op, status, result, headers)
    _send(world, call.outbox)
    return response


def _authenticate(world: World, op: Operation) -> auth.Access:
    value = auth.credentials(request.headers.get("Authorization"))
    permission, _ = auth.NEEDS[op.operation_id]
    with world.lock:
        if permission == "jwt":
            auth.verify_app_jwt(world, value)
            return auth.Access(app=True)
        return auth.Access(app=False, token=auth.installation_token(world, value))


def _body(op: Operation) -> Any:
    if op.body_schema is None or not request.get_data():
        return None
    try:
        body = json.loads(request.get_data())
    except ValueError as exc:
        raise ValidationFailed(
            [{"field": "(body)", "code": "invalid", "message": f"Problems parsing JSON: {exc}"}]
        ) from exc
    if op.operation_id == "issues/add-labels" and isinstance(body, list):
        # The description's own text: "You can also pass an array of labels directly" (PyGithub
        # does); its schema lists only the object form, so the array is read as that form.
        body = {"labels": body}
    return body


@functools.cache
def _completer() -> schema.Completer:
    return schema.Completer()


def _render(op: Operation, status: int, result: Any, headers: dict[str, str]) -> Response:
    headers = {**RATE_LIMIT, "X-GitHub-Request-Id": uuid.uuid4().hex[:16].upper(), **headers}
    if isinstance(result, bytes):
        response = Response(result, status=status, headers=headers)
        response.content_type = headers.get("Content-Type", "application/octet-stream")
        return response
    response_schema = op.response_schema(status)
    if result is not None and response_schema is not None:
        result = _completer().complete(response_schema, result)
    return json_response(status, result, headers)


def _send(world: World, outbox: list[Delivery]) -> None:
    for found in outbox:
        webhooks.send(world, found)


def _take_fault(world: World, method: str, path: str) -> Response | None:
    with world.lock:
        for fault in world.faults:
            if fault.remaining <= 0 or not fnmatch.fnmatchcase(path, fault.path):
                continue
            if fault.method and fault.method.upper() != method:
                continue
            fault.remaining -= 1
            headers = {**RATE_LIMIT}
            if fault.retry_after is not None:
                headers["Retry-After"] = str(fault.retry_after)
            if fault.status == 429:
                headers["X-RateLimit-Remaining"] = "0"
                headers["X-RateLimit-Reset"] = str(int(time.time()) + (fault.retry_after or 60))
            world.faults = [f for f in world.faults if f.remaining > 0]
            body = {
                "message": FAULT_MESSAGES.get(fault.status, "Error"),
                "documentation_url": api.DOCS,
            }
            return json_response(fault.status, body, headers)
    return None
