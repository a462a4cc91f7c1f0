"""GitHub's JSON objects for fakehub's state, with the meaningful fields filled in; the rest of
each schema's required properties is added by `schema.Completer` when a response is sent."""

from __future__ import annotations

import base64
from typing import Any

from fakehub.world import (
    CheckRun,
    Comment,
    Commit,
    Delivery,
    Installation,
    Pull,
    Reaction,
    Repo,
    World,
    blob_sha,
    tree_sha,
)

# A role's legacy `permission` and the booleans in a collaborator's `permissions`.
LEGACY_PERMISSION = {
    "admin": "admin",
    "maintain": "write",
    "write": "write",
    "triage": "read",
    "read": "read",
}
_ROLE_ORDER = ["read", "triage", "write", "maintain", "admin"]


def node_id(kind: str, ident: int | str) -> str:
    return base64.b64encode(f"{kind}:{ident}".encode()).decode()


def user(world: World, login: str, api: str) -> dict[str, Any]:
    found = world.user(login)
    base = f"{api}/users/{login}"
    return {
        "login": login,
        "id": found.id,
        "node_id": node_id("User", found.id),
        "avatar_url": f"{api}/_fakehub/avatars/{login}",
        "gravatar_id": "",
        "url": base,
        "html_url": f"{api}/{login}",
        "followers_url": f"{base}/followers",
        "following_url": f"{base}/following{{/other_user}}",
        "gists_url": f"{base}/gists{{/gist_id}}",
        "starred_url": f"{base}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{base}/subscriptions",
        "organizations_url": f"{base}/orgs",
        "repos_url": f"{base}/repos",
        "events_url": f"{base}/events{{/privacy}}",
        "received_events_url": f"{base}/received_events",
        "type": found.type,
        "user_view_type": "public",
        "site_admin": False,
    }


def repository(world: World, repo: Repo, api: str) -> dict[str, Any]:
    url = f"{api}/repos/{repo.full_name}"
    shape: dict[str, Any] = {
        "id": repo.id,
        "node_id": node_id("Repository", repo.id),
        "name": repo.name,
        "full_name": repo.full_name,
        "owner": user(world, repo.owner, api),
        "private": repo.private,
        "visibility": "private" if repo.private else "public",
        "html_url": f"{api}/{repo.full_name}",
        "description": None,
        "fork": repo.fork_of is not None,
        "url": url,
        "default_branch": repo.default_branch,
        "created_at": repo.created_at,
        "updated_at": repo.created_at,
        "pushed_at": repo.created_at,
        "homepage": None,
        "language": "Python",
        "license": None,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "has_issues": True,
        "has_projects": False,
        "has_wiki": False,
        "has_pages": False,
        "has_discussions": False,
        "clone_url": f"{api}/{repo.full_name}.git",
        "git_url": f"git://fakehub.invalid/{repo.full_name}.git",
        "ssh_url": f"git@fakehub.invalid:{repo.full_name}.git",
        "svn_url": f"{api}/{repo.full_name}",
        "archive_url": f"{url}/{{archive_format}}{{/ref}}",
        "branches_url": f"{url}/branches{{/branch}}",
        "collaborators_url": f"{url}/collaborators{{/collaborator}}",
        "commits_url": f"{url}/commits{{/sha}}",
        "contents_url": f"{url}/contents/{{+path}}",
        "issue_comment_url": f"{url}/issues/comments{{/number}}",
        "issues_url": f"{url}/issues{{/number}}",
        "labels_url": f"{url}/labels{{/name}}",
        "pulls_url": f"{url}/pulls{{/number}}",
        "statuses_url": f"{url}/statuses/{{sha}}",
    }
    if repo.fork_of is not None and repo.fork_of in world.repos:
        parent = world.repos[repo.fork_of]
        shape["parent"] = shape["source"] = {
            "id": parent.id,
            "full_name": parent.full_name,
            "name": parent.name,
            "url": f"{api}/repos/{parent.full_name}",
        }
    return shape


def app(world: World, api: str) -> dict[str, Any]:
    the_app = world.app
    owner = user(world, the_app.owner, api)
    return {
        "id": the_app.id,
        "slug": the_app.slug,
        "node_id": node_id("Integration", the_app.id),
        "client_id": f"Iv1.{the_app.id:016x}",
        "owner": owner,
        "name": the_app.name,
        "description": "",
        "external_url": f"{api}/apps/{the_app.slug}",
        "html_url": f"{api}/apps/{the_app.slug}",
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": "2024-01-01T00:00:00Z",
        "permissions": dict(the_app.permissions),
        "events": list(the_app.events),
    }


def installation(world: World, inst: Installation, api: str) -> dict[str, Any]:
    account = world.user(inst.account)
    return {
        "id": inst.id,
        "account": user(world, inst.account, api),
        "repository_selection": "all" if inst.repositories is None else "selected",
        "access_tokens_url": f"{api}/app/installations/{inst.id}/access_tokens",
        "repositories_url": f"{api}/installation/repositories",
        "html_url": f"{api}/settings/installations/{inst.id}",
        "app_id": world.app.id,
        "app_slug": world.app.slug,
        "target_id": account.id,
        "target_type": account.type,
        "permissions": dict(inst.permissions),
        "events": list(world.app.events),
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": "2024-01-01T00:00:00Z",
        "single_file_name": None,
        "suspended_by": None,
        "suspended_at": None,
    }


def label(world: World, repo: Repo, name: str, api: str) -> dict[str, Any]:
    ident = world.label_id(repo, name)
    return {
        "id": ident,
        "node_id": node_id("Label", ident),
        "url": f"{api}/repos/{repo.full_name}/labels/{name}",
        "name": name,
        "description": None,
        "color": "ededed",
        "default": False,
    }


def author_association(world: World, repo: Repo, login: str) -> str:
    role = world.role(repo, login)
    if login == repo.owner:
        return "OWNER"
    owner = world.users.get(repo.owner)
    if owner is not None and login in owner.members:
        return "MEMBER"
    return "COLLABORATOR" if role else "CONTRIBUTOR"


def _branch_end(world: World, repo: Repo, ref: str, sha: str, api: str) -> dict[str, Any]:
    return {
        "label": f"{repo.owner}:{ref}",
        "ref": ref,
        "sha": sha,
        "user": user(world, repo.owner, api),
        "repo": repository(world, repo, api),
    }


def _head(world: World, pr: Pull, api: str) -> dict[str, Any]:
    """The pull request's head; `repo` is null once the head repository was deleted."""
    if pr.head_repo is not None:
        return _branch_end(world, world.repos[pr.head_repo], pr.head_ref, pr.head_sha, api)
    return {
        "label": f"{pr.head_owner}:{pr.head_ref}",
        "ref": pr.head_ref,
        "sha": pr.head_sha,
        "user": user(world, pr.head_owner, api),
        "repo": None,
    }


def pull(world: World, pr: Pull, api: str) -> dict[str, Any]:
    repo = world.repos[pr.repo]
    url = f"{api}/repos/{pr.repo}/pulls/{pr.number}"
    issue_url = f"{api}/repos/{pr.repo}/issues/{pr.number}"
    html = f"{api}/{pr.repo}/pull/{pr.number}"
    return {
        "url": url,
        "id": pr.id,
        "node_id": node_id("PullRequest", pr.id),
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": issue_url,
        "commits_url": f"{url}/commits",
        "review_comments_url": f"{url}/comments",
        "review_comment_url": f"{api}/repos/{pr.repo}/pulls/comments{{/number}}",
        "comments_url": f"{issue_url}/comments",
        "statuses_url": f"{api}/repos/{pr.repo}/statuses/{pr.head_sha}",
        "number": pr.number,
        "state": pr.state,
        "locked": False,
        "title": pr.title,
        "user": user(world, pr.author, api),
        "body": pr.body,
        "labels": [label(world, repo, name, api) for name in pr.labels],
        "milestone": None,
        "active_lock_reason": None,
        "created_at": pr.created_at,
        "updated_at": pr.updated_at,
        "closed_at": pr.closed_at,
        "merged_at": None,
        "merge_commit_sha": None,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": _head(world, pr, api),
        "base": _branch_end(world, repo, pr.base_ref, pr.base_sha, api),
        "_links": {
            name: {"href": href}
            for name, href in {
                "self": url,
                "html": html,
                "issue": issue_url,
                "comments": f"{issue_url}/comments",
                "review_comments": f"{url}/comments",
                "review_comment": f"{api}/repos/{pr.repo}/pulls/comments{{/number}}",
                "commits": f"{url}/commits",
                "statuses": f"{api}/repos/{pr.repo}/statuses/{pr.head_sha}",
            }.items()
        },
        "author_association": author_association(world, repo, pr.author),
        "auto_merge": None,
        "draft": pr.draft,
        "merged": False,
        "mergeable": True,
        "rebaseable": True,
        "mergeable_state": "clean",
        "merged_by": None,
        "comments": sum(
            1 for c in world.comments.values() if (c.repo, c.issue_number) == (pr.repo, pr.number)
        ),
        "review_comments": 0,
        "maintainer_can_modify": False,
        "commits": 1,
        "additions": 0,
        "deletions": 0,
        "changed_files": 0,
    }


def issue_for_pull(world: World, pr: Pull, api: str) -> dict[str, Any]:
    """The issue side of a pull request, as `issue_comment` webhooks carry it."""
    shape = pull(world, pr, api)
    issue_url = shape["issue_url"]
    return {
        "url": issue_url,
        "repository_url": f"{api}/repos/{pr.repo}",
        "labels_url": f"{issue_url}/labels{{/name}}",
        "comments_url": f"{issue_url}/comments",
        "events_url": f"{issue_url}/events",
        "html_url": shape["html_url"],
        "id": pr.id,
        "node_id": node_id("Issue", pr.id),
        "number": pr.number,
        "title": pr.title,
        "user": shape["user"],
        "labels": shape["labels"],
        "state": pr.state,
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": shape["comments"],
        "created_at": pr.created_at,
        "updated_at": pr.updated_at,
        "closed_at": pr.closed_at,
        "author_association": shape["author_association"],
        "active_lock_reason": None,
        "draft": pr.draft,
        "body": pr.body,
        "performed_via_github_app": None,
        "pull_request": {
            "url": shape["url"],
            "html_url": shape["html_url"],
            "diff_url": shape["diff_url"],
            "patch_url": shape["patch_url"],
            "merged_at": None,
        },
        "reactions": reactions_summary([], f"{issue_url}/reactions"),
        "timeline_url": f"{issue_url}/timeline",
        "state_reason": None,
    }


def reactions_summary(reactions: list[Reaction], url: str) -> dict[str, Any]:
    counts = {
        key: 0 for key in ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
    }
    for reaction in reactions:
        counts[reaction.content] += 1
    return {"url": url, "total_count": len(reactions), **counts}


def comment(world: World, found: Comment, api: str) -> dict[str, Any]:
    repo = world.repos[found.repo]
    url = f"{api}/repos/{found.repo}/issues/comments/{found.id}"
    return {
        "id": found.id,
        "node_id": node_id("IssueComment", found.id),
        "url": url,
        "html_url": f"{api}/{found.repo}/pull/{found.issue_number}#issuecomment-{found.id}",
        "issue_url": f"{api}/repos/{found.repo}/issues/{found.issue_number}",
        "body": found.body,
        "user": user(world, found.user, api),
        "created_at": found.created_at,
        "updated_at": found.updated_at or found.created_at,
        "author_association": author_association(world, repo, found.user),
        "performed_via_github_app": None,
        "reactions": reactions_summary(found.reactions, f"{url}/reactions"),
    }


def reaction(world: World, found: Reaction, api: str) -> dict[str, Any]:
    return {
        "id": found.id,
        "node_id": node_id("Reaction", found.id),
        "user": user(world, found.user, api),
        "content": found.content,
        "created_at": found.created_at,
    }


def pull_minimal(world: World, pr: Pull, api: str) -> dict[str, Any]:
    def end(repo_name: str | None, ref: str, sha: str) -> dict[str, Any]:
        if repo_name is None:
            return {"ref": ref, "sha": sha, "repo": None}
        repo = world.repos[repo_name]
        shown = {"id": repo.id, "url": f"{api}/repos/{repo_name}", "name": repo.name}
        return {"ref": ref, "sha": sha, "repo": shown}

    return {
        "id": pr.id,
        "number": pr.number,
        "url": f"{api}/repos/{pr.repo}/pulls/{pr.number}",
        "head": end(pr.head_repo, pr.head_ref, pr.head_sha),
        "base": end(pr.repo, pr.base_ref, pr.base_sha),
    }


def check_run_pulls(world: World, run: CheckRun) -> list[Pull]:
    """Open same-repository pull requests whose head is the run's commit (GitHub lists none for
    pull requests from forks)."""
    return [
        pr
        for pr in world.pulls.values()
        if pr.repo == run.repo
        and pr.head_repo == pr.repo
        and pr.head_sha == run.head_sha
        and pr.state == "open"
    ]


def check_run(world: World, run: CheckRun, api: str) -> dict[str, Any]:
    url = f"{api}/repos/{run.repo}/check-runs/{run.id}"
    fields = run.fields
    output = fields.get("output") or {}
    pulls = [pull_minimal(world, pr, api) for pr in check_run_pulls(world, run)]
    return {
        "id": run.id,
        "node_id": node_id("CheckRun", run.id),
        "head_sha": run.head_sha,
        "external_id": fields.get("external_id", ""),
        "url": url,
        "html_url": f"{api}/{run.repo}/runs/{run.id}",
        # GitHub falls back to the App's page when a run has no details_url.
        "details_url": fields.get("details_url") or f"{api}/apps/{world.app.slug}",
        "status": fields.get("status", "queued"),
        "conclusion": fields.get("conclusion"),
        "started_at": fields.get("started_at"),
        "completed_at": fields.get("completed_at"),
        "output": {
            "title": output.get("title"),
            "summary": output.get("summary"),
            "text": output.get("text"),
            "annotations_count": len(output.get("annotations", [])),
            "annotations_url": f"{url}/annotations",
        },
        "name": fields["name"],
        "check_suite": {"id": run.suite_id},
        "app": app(world, api),
        "pull_requests": pulls,
        "actions": list(fields.get("actions", [])),
    }


def check_suite(world: World, run: CheckRun, api: str) -> dict[str, Any]:
    """The simple check suite that check_run webhooks embed."""
    repo = world.repos[run.repo]
    branch = next((b for b, sha in repo.branches.items() if sha == run.head_sha), None)
    return {
        "id": run.suite_id,
        "node_id": node_id("CheckSuite", run.suite_id),
        "head_branch": branch,
        "head_sha": run.head_sha,
        "status": run.fields.get("status", "queued"),
        "conclusion": run.fields.get("conclusion"),
        "url": f"{api}/repos/{run.repo}/check-suites/{run.suite_id}",
        "before": None,
        "after": run.head_sha,
        "pull_requests": [pull_minimal(world, pr, api) for pr in check_run_pulls(world, run)],
        "app": app(world, api),
        "repository": repository(world, repo, api),
        "created_at": run.history[0]["at"] if run.history else None,
        "updated_at": run.history[-1]["at"] if run.history else None,
    }


def git_user(login: str, date: str) -> dict[str, Any]:
    return {"name": login, "email": f"{login}@users.noreply.fakehub.invalid", "date": date}


def commit(world: World, repo: Repo, found: Commit, api: str) -> dict[str, Any]:
    url = f"{api}/repos/{repo.full_name}/commits/{found.sha}"
    author = user(world, found.author, api) if found.author in world.users else None
    return {
        "url": url,
        "sha": found.sha,
        "node_id": node_id("Commit", found.sha),
        "html_url": f"{api}/{repo.full_name}/commit/{found.sha}",
        "comments_url": f"{url}/comments",
        "commit": {
            "url": f"{api}/repos/{repo.full_name}/git/commits/{found.sha}",
            "author": git_user(found.author, found.date),
            "committer": git_user(found.author, found.date),
            "message": found.message,
            "tree": {
                "sha": tree_sha(found.files),
                "url": f"{api}/repos/{repo.full_name}/git/trees/{tree_sha(found.files)}",
            },
            "comment_count": 0,
        },
        "author": author,
        "committer": author,
        "parents": [
            {
                "sha": parent,
                "url": f"{api}/repos/{repo.full_name}/commits/{parent}",
                "html_url": f"{api}/{repo.full_name}/commit/{parent}",
            }
            for parent in found.parents
        ],
        "stats": {"additions": 0, "deletions": 0, "total": 0},
        "files": [],
    }


def branch(world: World, repo: Repo, name: str, api: str) -> dict[str, Any]:
    url = f"{api}/repos/{repo.full_name}/branches/{name}"
    return {
        "name": name,
        "commit": commit(world, repo, world.commits[repo.branches[name]], api),
        "_links": {"html": f"{api}/{repo.full_name}/tree/{name}", "self": url},
        "protected": False,
        "protection": {"enabled": False},
        "protection_url": f"{url}/protection",
    }


def content_file(repo: Repo, path: str, data: bytes, ref: str, api: str) -> dict[str, Any]:
    url = f"{api}/repos/{repo.full_name}/contents/{path}?ref={ref}"
    sha = blob_sha(data)
    git_url = f"{api}/repos/{repo.full_name}/git/blobs/{sha}"
    html_url = f"{api}/{repo.full_name}/blob/{ref}/{path}"
    return {
        "type": "file",
        "encoding": "base64",
        "size": len(data),
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "content": base64.b64encode(data).decode(),
        "sha": sha,
        "url": url,
        "git_url": git_url,
        "html_url": html_url,
        "download_url": None,
        "_links": {"git": git_url, "html": html_url, "self": url},
    }


def content_dir_entry(
    repo: Repo, path: str, kind: str, sha: str, ref: str, api: str
) -> dict[str, Any]:
    url = f"{api}/repos/{repo.full_name}/contents/{path}?ref={ref}"
    return {
        "type": kind,
        "size": 0,
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "sha": sha,
        "url": url,
        "git_url": None,
        "html_url": None,
        "download_url": None,
        "_links": {"git": None, "html": None, "self": url},
    }


def collaborator_permission(world: World, repo: Repo, login: str, api: str) -> dict[str, Any]:
    role = world.role(repo, login)
    rank = _ROLE_ORDER.index(role) if role else -1
    collaborator = user(world, login, api)
    collaborator["permissions"] = {
        name: role is not None and rank >= _ROLE_ORDER.index(needed)
        for name, needed in (
            ("pull", "read"),
            ("triage", "triage"),
            ("push", "write"),
            ("maintain", "maintain"),
            ("admin", "admin"),
        )
    }
    collaborator["role_name"] = role or "none"
    return {
        "permission": LEGACY_PERMISSION.get(role or "", "none"),
        "role_name": role or "none",
        "user": collaborator,
    }


def delivery(found: Delivery) -> dict[str, Any]:
    return {
        "id": found.id,
        "guid": found.guid,
        "delivered_at": found.delivered_at,
        "redelivery": found.redelivery,
        "duration": found.duration,
        "status": found.status,
        "status_code": found.status_code,
        "event": found.event,
        "action": found.action,
        "installation_id": found.installation_id,
        "repository_id": found.repository_id,
        "throttled_at": None,
    }
