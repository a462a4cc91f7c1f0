"""The /_fakehub/ control API: read the whole state and the request log, and act as GitHub's
users do (open, push, close, label, comment, edit a comment, delete a repository, click a check
run button, change a role, inject faults), each action delivering the webhook GitHub would
send."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from fakehub import archive, shapes, webhooks
from fakehub.world import (
    ROLES,
    Comment,
    Delivery,
    Fault,
    Pull,
    World,
    WorldError,
    delete_repo,
    open_pull,
    push,
    push_branch,
    timestamp,
)

blueprint = Blueprint("fakehub_control", __name__, url_prefix="/_fakehub")
LABEL_ROLES = {"triage", "write", "maintain", "admin"}


class ControlError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@blueprint.errorhandler(ControlError)
def _control_error(exc: ControlError) -> tuple[Response, int]:
    return jsonify({"message": exc.message}), exc.status


@blueprint.errorhandler(WorldError)
@blueprint.errorhandler(KeyError)
def _bad_input(exc: Exception) -> tuple[Response, int]:
    return jsonify({"message": f"bad request: {exc}"}), 400


def _world() -> World:
    found: World = current_app.extensions["fakehub"]
    return found


def _api() -> str:
    return request.host_url.rstrip("/")


def _json() -> dict[str, Any]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ControlError(400, "the body must be a JSON object")
    return body


def _user(world: World, body: dict[str, Any], key: str = "user") -> str:
    login = body.get(key)
    if not isinstance(login, str) or (login not in world.users and login != world.app.bot_login):
        raise ControlError(400, f"{key!r} must name a user of the world, got {login!r}")
    return login


def _pull(world: World, owner: str, name: str, number: int) -> Pull:
    pr = world.pulls.get((f"{owner}/{name}", number))
    if pr is None:
        raise ControlError(404, f"no pull request {owner}/{name}#{number}")
    return pr


def _deliver(world: World, event: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """Record and send the event (outside the lock); its delivery as the caller sees it."""
    sent = webhooks.emit(world, event, payload)
    return None if sent is None else _delivery_json(sent, with_payload=False)


def _delivery_json(found: Delivery, *, with_payload: bool = True) -> dict[str, Any]:
    shown = {**shapes.delivery(found)}
    if with_payload:
        shown["payload"] = found.payload
    return shown


# ------------------------------------------------------------------------------ state


@blueprint.get("/state")
def state() -> Response:
    world = _world()
    with world.lock:
        return jsonify(
            {
                "app": {
                    "id": world.app.id,
                    "slug": world.app.slug,
                    "bot_login": world.app.bot_login,
                    "webhook_url": world.app.webhook_url,
                    "events": world.app.events,
                },
                "repos": {name: _repo_json(world, name) for name in world.repos},
                "pulls": [_pull_json(pr) for pr in world.pulls.values()],
                "check_runs": [dataclasses.asdict(run) for run in world.check_runs.values()],
                "comments": [_comment_json(c) for c in world.comments.values()],
                "deliveries": [_delivery_json(d) for d in world.deliveries],
                "tokens": [_token_json(t) for t in world.tokens.values()],
                "faults": [dataclasses.asdict(f) for f in world.faults],
            }
        )


def _repo_json(world: World, name: str) -> dict[str, Any]:
    repo = world.repos[name]
    return {
        "id": repo.id,
        "default_branch": repo.default_branch,
        "private": repo.private,
        "fork_of": repo.fork_of,
        "branches": dict(repo.branches),
        "collaborators": dict(repo.collaborators),
    }


def _pull_json(pr: Pull) -> dict[str, Any]:
    return dataclasses.asdict(pr)


def _comment_json(found: Comment) -> dict[str, Any]:
    return dataclasses.asdict(found)


def _token_json(token: Any) -> dict[str, Any]:
    return {
        "token_prefix": token.token[:8],
        "installation_id": token.installation_id,
        "repositories": None if token.repositories is None else sorted(token.repositories),
        "permissions": token.permissions,
        "expires_at": token.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


# ------------------------------------------------------------------------------ pull requests


@blueprint.post("/pulls")
def open_pull_request() -> tuple[Response, int]:
    world, body = _world(), _json()
    with world.lock:
        _user(world, body, "author")
        if (body.get("repo"), body.get("number")) in world.pulls:
            raise ControlError(422, f"pull request {body['repo']}#{body['number']} exists")
        pr = open_pull(world, body, base_dir=Path.cwd())
        payload = webhooks.pull_request_event(world, pr, "opened", pr.author, _api())
    delivery = _deliver(world, "pull_request", payload)
    return jsonify({"pull": _pull_json(pr), "delivery": delivery}), 201


@blueprint.post("/pulls/<owner>/<name>/<int:number>/push")
def push_to_pull(owner: str, name: str, number: int) -> Response:
    world, body = _world(), request.get_json(silent=True) or {}
    with world.lock:
        pr = _pull(world, owner, name, number)
        sender = _user(world, {"user": body.get("user", pr.author)})
        if pr.head_repo is None:
            raise ControlError(422, f"{pr.repo}#{number}: its head repository was deleted")
        before = pr.head_sha
        commit = push(world, pr, body.get("files"), body.get("message"), sender)
        payload = webhooks.pull_request_event(
            world, pr, "synchronize", sender, _api(), before=before
        )
    delivery = _deliver(world, "pull_request", payload)
    return jsonify({"pull": _pull_json(pr), "sha": commit.sha, "delivery": delivery})


@blueprint.post("/pulls/<owner>/<name>/<int:number>/close")
def close_pull(owner: str, name: str, number: int) -> Response:
    world, body = _world(), request.get_json(silent=True) or {}
    with world.lock:
        pr = _pull(world, owner, name, number)
        sender = _user(world, {"user": body.get("user", pr.author)})
        pr.state, pr.closed_at = "closed", timestamp()
        pr.updated_at = pr.closed_at
        payload = webhooks.pull_request_event(world, pr, "closed", sender, _api())
    delivery = _deliver(world, "pull_request", payload)
    return jsonify({"pull": _pull_json(pr), "delivery": delivery})


@blueprint.post("/pulls/<owner>/<name>/<int:number>/labels")
def label_pull(owner: str, name: str, number: int) -> Response:
    """{"user": login, "add": label} or {"user": login, "remove": label}."""
    world, body = _world(), _json()
    with world.lock:
        pr = _pull(world, owner, name, number)
        sender = _user(world, body)
        if (
            sender != world.app.bot_login
            and world.role(world.repos[pr.repo], sender) not in LABEL_ROLES
        ):
            raise ControlError(403, f"{sender} may not label {pr.repo}: needs triage or more")
        action, label = _label_change(pr, body)
        payload = webhooks.pull_request_event(world, pr, action, sender, _api(), label=label)
    delivery = _deliver(world, "pull_request", payload)
    return jsonify({"pull": _pull_json(pr), "delivery": delivery})


def _label_change(pr: Pull, body: dict[str, Any]) -> tuple[str, str]:
    if isinstance(body.get("add"), str):
        if body["add"] in pr.labels:
            raise ControlError(422, f"{body['add']!r} is already on the pull request")
        pr.labels.append(body["add"])
        return "labeled", body["add"]
    if isinstance(body.get("remove"), str):
        if body["remove"] not in pr.labels:
            raise ControlError(422, f"{body['remove']!r} is not on the pull request")
        pr.labels.remove(body["remove"])
        return "unlabeled", body["remove"]
    raise ControlError(400, 'give "add": label or "remove": label')


@blueprint.post("/pulls/<owner>/<name>/<int:number>/comments")
def comment_on_pull(owner: str, name: str, number: int) -> tuple[Response, int]:
    world, body = _world(), _json()
    with world.lock:
        pr = _pull(world, owner, name, number)
        sender = _user(world, body)
        if not isinstance(body.get("body"), str):
            raise ControlError(400, '"body" must be the comment text')
        found = Comment(world.next_id(), pr.repo, pr.number, sender, body["body"], timestamp())
        world.comments[found.id] = found
        payload = webhooks.issue_comment_event(world, found, pr, _api())
    delivery = _deliver(world, "issue_comment", payload)
    return jsonify({"comment": _comment_json(found), "delivery": delivery}), 201


@blueprint.patch("/comments/<int:comment_id>")
def edit_comment(comment_id: int) -> Response:
    """{"body": text, "user"?: login}: edit a comment, as its author (the default) or a user
    with write access does; delivers `issue_comment` edited with the old body in `changes`."""
    world, body = _world(), _json()
    with world.lock:
        found = world.comments.get(comment_id)
        if found is None:
            raise ControlError(404, f"no comment {comment_id}")
        sender = _user(world, {"user": body.get("user", found.user)})
        if sender != found.user and world.role(world.repos[found.repo], sender) not in (
            "write",
            "maintain",
            "admin",
        ):
            raise ControlError(403, f"{sender} may not edit {found.user}'s comment: needs write")
        if not isinstance(body.get("body"), str):
            raise ControlError(400, '"body" must be the new comment text')
        before, found.body, found.updated_at = found.body, body["body"], timestamp()
        owner, name = found.repo.split("/")
        pr = _pull(world, owner, name, found.issue_number)
        payload = webhooks.issue_comment_event(
            world, found, pr, _api(), sender=sender, edited_from=before
        )
    delivery = _deliver(world, "issue_comment", payload)
    return jsonify({"comment": _comment_json(found), "delivery": delivery})


# ------------------------------------------------------------------------------ repositories


@blueprint.post("/repos/<owner>/<name>/delete")
def delete_repository(owner: str, name: str) -> Response:
    """Delete a repository (a fork, say): its pull requests stay open with `head.repo` null.
    GitHub tells the base repository's App nothing, so no webhook is sent; the next event
    about such a pull request carries the null head repository."""
    world = _world()
    with world.lock:
        orphans = delete_repo(world, f"{owner}/{name}")
        return jsonify(
            {"deleted": f"{owner}/{name}", "pulls": [f"{pr.repo}#{pr.number}" for pr in orphans]}
        )


@blueprint.post("/repos/<owner>/<name>/branches/<path:branch>/push")
def push_to_branch(owner: str, name: str, branch: str) -> Response:
    """A commit on a branch (the default branch's history, say). GitHub would send a `push`
    event, which fakehub does not model: no webhook."""
    world, body = _world(), _json()
    files = body.get("files")
    if files is not None and not isinstance(files, dict):
        raise ControlError(400, "'files' must map paths to text (or null to delete)")
    with world.lock:
        sender = _user(world, body)
        commit = push_branch(world, f"{owner}/{name}", branch, files, sender)
    return jsonify({"sha": commit.sha, "branch": branch})


# ------------------------------------------------------------------------------ check runs


@blueprint.post("/check-runs/<int:run_id>/requested-action")
def click_button(run_id: int) -> Response:
    world, body = _world(), _json()
    with world.lock:
        run = world.check_runs.get(run_id)
        if run is None:
            raise ControlError(404, f"no check run {run_id}")
        sender = _user(world, body)
        identifier = body.get("identifier")
        offered = [a["identifier"] for a in run.fields.get("actions", [])]
        if identifier not in offered:
            raise ControlError(422, f"check run {run_id} offers {offered}, not {identifier!r}")
        payload = webhooks.check_run_event(
            world, run, "requested_action", sender, _api(), identifier=identifier
        )
    return jsonify({"delivery": _deliver(world, "check_run", payload)})


@blueprint.post("/check-runs/<int:run_id>/rerequest")
def rerequest(run_id: int) -> Response:
    world, body = _world(), _json()
    with world.lock:
        run = world.check_runs.get(run_id)
        if run is None:
            raise ControlError(404, f"no check run {run_id}")
        sender = _user(world, body)
        payload = webhooks.check_run_event(world, run, "rerequested", sender, _api())
    return jsonify({"delivery": _deliver(world, "check_run", payload)})


# ------------------------------------------------------------------------------ world edits


@blueprint.put("/permissions")
def set_permission() -> Response:
    """{"repo": full name, "user": login, "role": read|triage|write|maintain|admin|none}."""
    world, body = _world(), _json()
    with world.lock:
        repo = world.repos.get(str(body.get("repo")))
        if repo is None:
            raise ControlError(404, f"no repository {body.get('repo')!r}")
        login = _user(world, body)
        role = body.get("role")
        if role in (None, "none"):
            repo.collaborators.pop(login, None)
        elif role in ROLES:
            repo.collaborators[login] = role
        else:
            raise ControlError(400, f"role must be one of {(*ROLES, 'none')}, got {role!r}")
        return jsonify({"repo": repo.full_name, "collaborators": repo.collaborators})


@blueprint.post("/faults")
def add_fault() -> tuple[Response, int]:
    """{"path": glob, "method"?: verb, "status": 500|502|503|403|429, "count"?: n,
    "retry_after"?: seconds}: the next n matching GitHub requests fail that way."""
    world, body = _world(), _json()
    status = body.get("status")
    if status not in (403, 429, 500, 502, 503) or not isinstance(body.get("path"), str):
        raise ControlError(400, '"path" (a glob) and "status" (403, 429, 500, 502 or 503) needed')
    fault = Fault(
        path=body["path"],
        method=body.get("method"),
        status=int(status),
        remaining=int(body.get("count", 1)),
        retry_after=body.get("retry_after"),
    )
    with world.lock:
        world.faults.append(fault)
        return jsonify({"faults": [dataclasses.asdict(f) for f in world.faults]}), 201


@blueprint.delete("/faults")
def clear_faults() -> Response:
    world = _world()
    with world.lock:
        world.faults.clear()
    return jsonify({"faults": []})


@blueprint.get("/requests")
def list_requests() -> Response:
    """Every GitHub API request fakehub answered, oldest first (the control API is not one)."""
    world = _world()
    with world.lock:
        return jsonify({"requests": list(world.requests)})


@blueprint.delete("/requests")
def clear_requests() -> Response:
    world = _world()
    with world.lock:
        world.requests.clear()
    return jsonify({"requests": []})


# ------------------------------------------------------------------------------ downloads


@blueprint.get("/codeload/<owner>/<name>/legacy.tar.gz/<sha>")
def download_tarball(owner: str, name: str, sha: str) -> Response:
    """Where a tarball link redirects; the link's token proves it came from the API."""
    world, full_name = _world(), f"{owner}/{name}"
    secret = current_app.config["FAKEHUB_LINK_SECRET"]
    if not archive.link_valid(secret, full_name, sha, request.args.get("token", "")):
        raise ControlError(404, "Not Found")
    with world.lock:
        commit = world.commits.get(sha)
        if commit is None or full_name not in world.repos:
            raise ControlError(404, "Not Found")
        data = archive.tarball(owner, name, commit)
    filename = f"{owner}-{name}-{sha[:7]}.tar.gz"
    return Response(
        data,
        mimetype="application/x-gzip",
        headers={"Content-Disposition": f"attachment; filename={filename}"},
    )
