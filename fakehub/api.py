"""The REST operations, one handler per operationId. Handlers run under the world's lock and
return (status, body, headers); webhook events they cause are recorded in `call.outbox` and sent
after the lock is released."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fakehub import archive, auth, shapes, webhooks
from fakehub.description import Operation, ValidationFailed
from fakehub.world import CheckRun, Comment, Delivery, Pull, Reaction, Repo, World, timestamp

DOCS = "https://docs.github.com/rest"


class NotFound(Exception):
    def __init__(self, message: str = "Not Found") -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Call:
    world: World
    op: Operation
    params: dict[str, Any]
    body: Any
    api: str
    accept: str
    access: auth.Access
    link_secret: bytes
    outbox: list[Delivery] = field(default_factory=list)

    @property
    def repo(self) -> Repo:
        return repo_named(self.world, f"{self.params['owner']}/{self.params['repo']}")

    @property
    def actor(self) -> str:
        """Who acts with an installation token: the App's bot user."""
        return self.world.app.bot_login

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        if event in self.world.app.events:
            self.outbox.append(webhooks.record(self.world, event, payload))


Result = tuple[int, Any, dict[str, str]]
HANDLERS: dict[str, Callable[[Call], Result]] = {}


def handles(operation_id: str) -> Callable[[Callable[[Call], Result]], Callable[[Call], Result]]:
    def register(func: Callable[[Call], Result]) -> Callable[[Call], Result]:
        HANDLERS[operation_id] = func
        return func

    return register


def repo_named(world: World, full_name: str) -> Repo:
    for name, repo in world.repos.items():
        if name.lower() == full_name.lower():
            return repo
    raise NotFound()


def unprocessable(field_name: str, message: str) -> ValidationFailed:
    return ValidationFailed([{"field": field_name, "code": "invalid", "message": message}])


def paginate(items: list[Any], params: dict[str, Any]) -> list[Any]:
    per_page = max(1, min(int(params.get("per_page", 30)), 100))
    page = max(1, int(params.get("page", 1)))
    return items[(page - 1) * per_page : page * per_page]


def the_pull(call: Call, number: int) -> Pull:
    pr = call.world.pulls.get((call.repo.full_name, number))
    if pr is None:
        raise NotFound()
    return pr


# ------------------------------------------------------------------------------ apps


@handles("apps/get-authenticated")
def get_app(call: Call) -> Result:
    return 200, shapes.app(call.world, call.api), {}


@handles("apps/get-repo-installation")
def get_repo_installation(call: Call) -> Result:
    inst = call.world.installation_for(call.repo)
    if inst is None:
        raise NotFound()
    return 200, shapes.installation(call.world, inst, call.api), {}


@handles("apps/create-installation-access-token")
def create_token(call: Call) -> Result:
    inst = call.world.installations.get(call.params["installation_id"])
    if inst is None:
        raise NotFound()
    token = auth.issue_token(call.world, inst, call.body or {})
    body: dict[str, Any] = {
        "token": token.token,
        "expires_at": token.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "permissions": token.permissions,
        "repository_selection": "all" if token.repositories is None else "selected",
    }
    if token.repositories is not None:
        body["repositories"] = [
            shapes.repository(call.world, call.world.repos[name], call.api)
            for name in sorted(token.repositories)
        ]
    return 201, body, {}


@handles("apps/list-webhook-deliveries")
def list_deliveries(call: Call) -> Result:
    found = sorted(call.world.deliveries, key=lambda d: -d.id)
    wanted = call.params.get("status")
    if wanted is not None:
        found = [d for d in found if (d.status == "OK") == (wanted == "success")]
    cursor = str(call.params.get("cursor") or "")
    if cursor:
        if not cursor.isdigit():
            raise unprocessable("cursor", f"{cursor!r} is not a cursor this API returned")
        found = [d for d in found if d.id < int(cursor)]
    per_page = max(1, min(int(call.params.get("per_page", 30)), 100))
    page = found[:per_page]
    headers = {}
    if len(found) > per_page:
        headers["Link"] = (
            f'<{call.api}/app/hook/deliveries?per_page={per_page}&cursor={page[-1].id}>; rel="next"'
        )
    return 200, [shapes.delivery(d) for d in page], headers


@handles("apps/redeliver-webhook-delivery")
def redeliver(call: Call) -> Result:
    old = next((d for d in call.world.deliveries if d.id == call.params["delivery_id"]), None)
    if old is None:
        raise NotFound()
    call.outbox.append(
        webhooks.record(call.world, old.event, old.payload, redelivery=True, guid=old.guid)
    )
    return 202, {}, {}


# ------------------------------------------------------------------------------ checks


def _check_semantics(body: dict[str, Any]) -> None:
    """What GitHub refuses beyond the schema: a completed run needs a conclusion."""
    if body.get("status") == "completed" and "conclusion" not in body:
        raise unprocessable("conclusion", "conclusion is required when status is completed")
    if "conclusion" in body and body.get("status", "completed") != "completed":
        raise unprocessable("status", "status must be completed when a conclusion is given")


@handles("checks/create")
def create_check_run(call: Call) -> Result:
    body = dict(call.body)
    _check_semantics(body)
    repo, world = call.repo, call.world
    if world.resolve_ref(repo, body["head_sha"]) is None or len(body["head_sha"]) != 40:
        raise unprocessable("head_sha", f"No commit found for SHA: {body['head_sha']}")
    now = timestamp()
    fields: dict[str, Any] = {"status": "queued", "started_at": now, **body}
    if "conclusion" in fields:
        fields["status"] = "completed"
        fields.setdefault("completed_at", now)
    suite = world.suites.setdefault((repo.full_name, body["head_sha"]), world.next_id())
    run = CheckRun(world.next_id(), repo.full_name, body["head_sha"], suite, fields)
    run.history.append({"at": now, "action": "created", "request": body})
    world.check_runs[run.id] = run
    return 201, shapes.check_run(world, run, call.api), {}


def the_check_run(call: Call) -> CheckRun:
    run = call.world.check_runs.get(call.params["check_run_id"])
    if run is None or run.repo != call.repo.full_name:
        raise NotFound()
    return run


@handles("checks/get")
def get_check_run(call: Call) -> Result:
    return 200, shapes.check_run(call.world, the_check_run(call), call.api), {}


@handles("checks/update")
def update_check_run(call: Call) -> Result:
    run = the_check_run(call)
    body = dict(call.body)
    if "conclusion" in body:
        body.setdefault("status", "completed")
    _check_semantics(body)
    now = timestamp()
    fields = run.fields
    output = body.pop("output", None)
    fields.update(body)
    if output is not None:
        annotations = fields.get("output", {}).get("annotations", []) + output.get(
            "annotations", []
        )
        fields["output"] = {**fields.get("output", {}), **output, "annotations": annotations}
    if fields.get("status") == "completed":
        fields.setdefault("completed_at", now)
    else:
        fields["conclusion"] = None
        fields.pop("completed_at", None)
    request = dict(call.body)
    run.history.append({"at": now, "action": "updated", "request": request})
    return 200, shapes.check_run(call.world, run, call.api), {}


@handles("checks/list-for-ref")
def list_check_runs(call: Call) -> Result:
    world, repo, params = call.world, call.repo, call.params
    commit = world.resolve_ref(repo, params["ref"])
    if commit is None:
        raise unprocessable("ref", f"No commit found for SHA: {params['ref']}")
    runs = [r for r in world.check_runs.values() if r.repo == repo.full_name]
    runs = [r for r in runs if r.head_sha == commit.sha]
    if "check_name" in params:
        runs = [r for r in runs if r.fields["name"] == params["check_name"]]
    if "status" in params:
        runs = [r for r in runs if r.fields.get("status") == params["status"]]
    if "app_id" in params and params["app_id"] != world.app.id:
        runs = []
    if params.get("filter", "latest") == "latest":
        newest: dict[str, CheckRun] = {}
        for run in runs:
            newest[run.fields["name"]] = run
        runs = list(newest.values())
    runs.sort(key=lambda r: -r.id)
    page = [shapes.check_run(world, r, call.api) for r in paginate(runs, params)]
    return 200, {"total_count": len(runs), "check_runs": page}, {}


# ------------------------------------------------------------------------------ repositories


@handles("repos/get")
def get_repo(call: Call) -> Result:
    return 200, shapes.repository(call.world, call.repo, call.api), {}


@handles("repos/get-branch")
def get_branch(call: Call) -> Result:
    repo = call.repo
    if call.params["branch"] not in repo.branches:
        raise NotFound("Branch not found")
    return 200, shapes.branch(call.world, repo, call.params["branch"], call.api), {}


@handles("repos/get-commit")
def get_commit(call: Call) -> Result:
    repo = call.repo
    commit = call.world.resolve_ref(repo, call.params["ref"])
    if commit is None:
        raise unprocessable("ref", f"No commit found for SHA: {call.params['ref']}")
    if "vnd.github.sha" in call.accept:
        return 200, commit.sha.encode(), {"Content-Type": "application/vnd.github.sha"}
    return 200, shapes.commit(call.world, repo, commit, call.api), {}


@handles("repos/get-content")
def get_content(call: Call) -> Result:
    repo = call.repo
    ref = call.params.get("ref") or repo.default_branch
    commit = call.world.resolve_ref(repo, ref)
    if commit is None:
        raise NotFound(f"No commit found for the ref {ref}")
    path = call.params["path"].strip("/")
    if path in commit.files:
        data = commit.files[path]
        if "vnd.github.raw" in call.accept:
            return 200, data, {"Content-Type": "application/vnd.github.raw"}
        return 200, shapes.content_file(repo, path, data, ref, call.api), {}
    listing = _directory(repo, commit.files, path, ref, call.api)
    if not listing:
        raise NotFound()
    return 200, listing, {}


def _directory(
    repo: Repo, files: dict[str, bytes], path: str, ref: str, api: str
) -> list[dict[str, Any]]:
    prefix = f"{path}/" if path else ""
    entries: dict[str, str] = {}
    for name in files:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            head = rest.split("/", 1)[0]
            entries[head] = "dir" if "/" in rest else "file"
    return [
        shapes.content_dir_entry(repo, posixpath.join(path, n), kind, "0" * 40, ref, api)
        for n, kind in sorted(entries.items())
    ]


@handles("repos/download-tarball-archive")
def tarball_link(call: Call) -> Result:
    repo = call.repo
    commit = call.world.resolve_ref(repo, call.params["ref"])
    if commit is None:
        raise NotFound()
    token = archive.link_token(call.link_secret, repo.full_name, commit.sha)
    location = (
        f"{call.api}/_fakehub/codeload/{repo.full_name}/legacy.tar.gz/{commit.sha}?token={token}"
    )
    return 302, None, {"Location": location}


@handles("repos/get-collaborator-permission-level")
def collaborator_permission(call: Call) -> Result:
    login = call.params["username"]
    if login not in call.world.users:
        raise NotFound(f"{login} is not a user")
    return 200, shapes.collaborator_permission(call.world, call.repo, login, call.api), {}


@handles("orgs/check-membership-for-user")
def org_membership(call: Call) -> Result:
    org = call.world.users.get(call.params["org"])
    if org is None or org.type != "Organization":
        raise NotFound()
    if call.params["username"] not in org.members:
        return 404, {"message": "User does not exist or is not a member of the organization"}, {}
    return 204, None, {}


# ------------------------------------------------------------------------------ issues


@handles("pulls/get")
def get_pull(call: Call) -> Result:
    return 200, shapes.pull(call.world, the_pull(call, call.params["pull_number"]), call.api), {}


@handles("issues/create-comment")
def create_comment(call: Call) -> Result:
    pr = the_pull(call, call.params["issue_number"])
    world = call.world
    found = Comment(world.next_id(), pr.repo, pr.number, call.actor, call.body["body"], timestamp())
    world.comments[found.id] = found
    call.emit("issue_comment", webhooks.issue_comment_event(world, found, pr, call.api))
    return 201, shapes.comment(world, found, call.api), {}


@handles("reactions/create-for-issue-comment")
def create_reaction(call: Call) -> Result:
    found = call.world.comments.get(call.params["comment_id"])
    if found is None or found.repo != call.repo.full_name:
        raise NotFound()
    content = call.body["content"]
    for existing in found.reactions:
        if (existing.user, existing.content) == (call.actor, content):
            return 200, shapes.reaction(call.world, existing, call.api), {}
    reaction = Reaction(call.world.next_id(), call.actor, content, timestamp())
    found.reactions.append(reaction)
    return 201, shapes.reaction(call.world, reaction, call.api), {}


def _labels(call: Call, pr: Pull) -> list[dict[str, Any]]:
    return [shapes.label(call.world, call.repo, name, call.api) for name in pr.labels]


@handles("issues/list-labels-on-issue")
def list_labels(call: Call) -> Result:
    pr = the_pull(call, call.params["issue_number"])
    return 200, paginate(_labels(call, pr), call.params), {}


@handles("issues/add-labels")
def add_labels(call: Call) -> Result:
    pr = the_pull(call, call.params["issue_number"])
    for item in (call.body or {}).get("labels", []):
        name = item if isinstance(item, str) else item["name"]
        if name not in pr.labels:
            pr.labels.append(name)
            payload = webhooks.pull_request_event(
                call.world, pr, "labeled", call.actor, call.api, label=name
            )
            call.emit("pull_request", payload)
    return 200, _labels(call, pr), {}


@handles("issues/remove-label")
def remove_label(call: Call) -> Result:
    pr = the_pull(call, call.params["issue_number"])
    name = call.params["name"]
    if name not in pr.labels:
        raise NotFound("Label does not exist")
    pr.labels.remove(name)
    payload = webhooks.pull_request_event(
        call.world, pr, "unlabeled", call.actor, call.api, label=name
    )
    call.emit("pull_request", payload)
    return 200, _labels(call, pr), {}
