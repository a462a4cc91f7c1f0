"""The fake GitHub's state: users, repositories with commits, the App and its installations, pull
requests, check runs, comments, tokens and webhook deliveries, loaded from a YAML world file."""

from __future__ import annotations

import hashlib
import itertools
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROLES = ("read", "triage", "write", "maintain", "admin")
DEFAULT_PERMISSIONS = {
    "checks": "write",
    "contents": "read",
    "issues": "write",
    "pull_requests": "write",
    "metadata": "read",
    "members": "read",
}
DEFAULT_EVENTS = ["check_run", "issue_comment", "pull_request"]


class WorldError(ValueError):
    """A world file that cannot be loaded; the message names the key."""


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def timestamp(moment: datetime | None = None) -> str:
    return (moment or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class User:
    login: str
    id: int
    type: str = "User"
    members: set[str] = field(default_factory=set)  # for organizations


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]
    parents: list[str]
    message: str
    author: str
    date: str


@dataclass
class Repo:
    id: int
    owner: str
    name: str
    default_branch: str
    private: bool
    fork_of: str | None
    branches: dict[str, str]  # name -> commit sha
    collaborators: dict[str, str]  # login -> role
    labels: dict[str, int] = field(default_factory=dict)  # name -> label id
    created_at: str = field(default_factory=timestamp)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class App:
    id: int
    slug: str
    name: str
    owner: str
    public_key_pem: bytes
    private_key_pem: bytes | None
    webhook_url: str | None
    webhook_secret: str | None
    permissions: dict[str, str]
    events: list[str]
    bot_user_id: int

    @property
    def bot_login(self) -> str:
        return f"{self.slug}[bot]"


@dataclass
class Installation:
    id: int
    account: str
    repositories: list[str] | None  # full names; None: all of the account's repositories
    permissions: dict[str, str]


@dataclass
class Pull:
    id: int
    number: int
    repo: str
    head_repo: str | None  # None once the head repository was deleted (a deleted fork)
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str
    author: str
    title: str
    body: str
    draft: bool
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=timestamp)
    updated_at: str = field(default_factory=timestamp)
    closed_at: str | None = None
    head_owner: str = ""  # the head repository's owner (kept when the repository is deleted)


@dataclass
class Reaction:
    id: int
    user: str
    content: str
    created_at: str


@dataclass
class Comment:
    id: int
    repo: str
    issue_number: int
    user: str
    body: str
    created_at: str
    reactions: list[Reaction] = field(default_factory=list)
    updated_at: str | None = None  # set by an edit


@dataclass
class CheckRun:
    id: int
    repo: str
    head_sha: str
    suite_id: int
    fields: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Token:
    token: str
    installation_id: int
    repositories: set[str] | None  # full names; None: every repository of the installation
    permissions: dict[str, str]
    expires_at: datetime


@dataclass
class Delivery:
    id: int
    guid: str
    event: str
    action: str | None
    payload: dict[str, Any]
    installation_id: int | None
    repository_id: int | None
    delivered_at: str
    status: str = "not delivered"
    status_code: int = 0
    duration: float = 0.0
    redelivery: bool = False


@dataclass
class Fault:
    path: str  # fnmatch pattern on the request path
    method: str | None
    status: int
    remaining: int
    retry_after: int | None


def tree_sha(files: dict[str, bytes]) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(files):
        blob = blob_sha(files[path])
        digest.update(f"{path}\0{blob}\n".encode())
    return digest.hexdigest()


def blob_sha(content: bytes) -> str:
    """The blob id git itself would give this content."""
    header = f"blob {len(content)}\0".encode()
    return hashlib.sha1(header + content, usedforsecurity=False).hexdigest()


def commit_sha(files: dict[str, bytes], parents: list[str], message: str) -> str:
    text = f"tree {tree_sha(files)}\n" + "".join(f"parent {p}\n" for p in parents) + message
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@dataclass
class World:
    """Everything fakehub knows. Callers hold `lock` while reading or changing it."""

    app: App
    users: dict[str, User]
    repos: dict[str, Repo]
    installations: dict[int, Installation]
    commits: dict[str, Commit] = field(default_factory=dict)
    pulls: dict[tuple[str, int], Pull] = field(default_factory=dict)
    comments: dict[int, Comment] = field(default_factory=dict)
    check_runs: dict[int, CheckRun] = field(default_factory=dict)
    suites: dict[tuple[str, str], int] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # the REST calls, in order
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(5000), repr=False)

    def next_id(self) -> int:
        return next(self._ids)

    def add_commit(
        self, files: dict[str, bytes], parents: list[str], message: str, author: str
    ) -> Commit:
        sha = commit_sha(files, parents, message)
        commit = Commit(sha, dict(files), parents, message, author, timestamp())
        self.commits.setdefault(sha, commit)
        return self.commits[sha]

    def user(self, login: str) -> User:
        if login == self.app.bot_login:
            return User(login, self.app.bot_user_id, "Bot")
        if login not in self.users and login == self.app.owner:
            return User(login, 900 + self.app.id, "Organization")
        if login not in self.users:
            raise KeyError(f"no user {login!r}")
        return self.users[login]

    def resolve_ref(self, repo: Repo, ref: str) -> Commit | None:
        """A branch name, `refs/heads/<name>`, or a full or abbreviated commit SHA."""
        ref = ref.removeprefix("refs/heads/")
        if ref in repo.branches:
            return self.commits[repo.branches[ref]]
        if len(ref) >= 7 and all(c in "0123456789abcdef" for c in ref):
            for sha, commit in self.commits.items():
                if sha.startswith(ref) and self._reachable(repo, sha):
                    return commit
        return None

    def _reachable(self, repo: Repo, sha: str) -> bool:
        """Commits are shared by a repository, its forks and its pull requests' heads."""
        names = {repo.full_name, repo.fork_of} | {
            r.full_name for r in self.repos.values() if r.fork_of == repo.full_name
        }
        return any(
            self.repos[name].branches.get(b) == sha or self._ancestor(self.repos[name], sha)
            for name in names
            if name in self.repos
            for b in self.repos[name].branches
        ) or any(p.head_sha == sha for p in self.pulls.values() if p.repo == repo.full_name)

    def _ancestor(self, repo: Repo, sha: str) -> bool:
        seen: set[str] = set()
        todo = list(repo.branches.values())
        while todo:
            current = todo.pop()
            if current == sha:
                return True
            if current not in seen and current in self.commits:
                seen.add(current)
                todo.extend(self.commits[current].parents)
        return False

    def role(self, repo: Repo, login: str) -> str | None:
        """The user's role on the repository (owner: admin), None without one."""
        if login == repo.owner:
            return "admin"
        owner = self.users.get(repo.owner)
        if owner is not None and owner.type == "Organization" and login in owner.members:
            return repo.collaborators.get(login, "read")
        return repo.collaborators.get(login)

    def installation_for(self, repo: Repo) -> Installation | None:
        for inst in self.installations.values():
            if inst.account != repo.owner:
                continue
            if inst.repositories is None or repo.full_name in inst.repositories:
                return inst
        return None

    def label_id(self, repo: Repo, name: str) -> int:
        if name not in repo.labels:
            repo.labels[name] = self.next_id()
        return repo.labels[name]


# ---------------------------------------------------------------------------- loading


def load_world(path: Path, *, key_path: Path | None = None) -> World:
    """Read a world file. `key_path` overrides where a generated private key is written."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise WorldError(f"{path}: the world must be a mapping")
    return build_world(data, base_dir=Path(path).resolve().parent, key_path=key_path)


def build_world(data: dict[str, Any], *, base_dir: Path, key_path: Path | None = None) -> World:
    users = {u["login"]: _user(u) for u in data.get("users", [])}
    app = _app(_require(data, "app"), base_dir, key_path)
    installations = {
        int(i["id"]): Installation(
            id=int(i["id"]),
            account=str(i["account"]),
            repositories=None if i.get("repositories", "all") == "all" else list(i["repositories"]),
            permissions=dict(i.get("permissions", app.permissions)),
        )
        for i in data.get("installations", [])
    }
    world = World(app=app, users=users, repos={}, installations=installations)
    for entry in data.get("repos", []):
        _add_repo(world, entry, base_dir)
    for entry in data.get("pulls", []):
        open_pull(world, entry, base_dir=base_dir)
    return world


def _require(data: dict[str, Any], key: str) -> Any:
    if key not in data:
        raise WorldError(f"world file: missing key {key!r}")
    return data[key]


def _user(entry: dict[str, Any]) -> User:
    return User(
        login=str(entry["login"]),
        id=int(entry["id"]),
        type=str(entry.get("type", "User")),
        members=set(entry.get("members", [])),
    )


def _app(entry: dict[str, Any], base_dir: Path, key_path: Path | None) -> App:
    private_pem, public_pem = _app_key(entry, base_dir, key_path)
    app_id = int(_require(entry, "id"))
    return App(
        id=app_id,
        slug=str(entry.get("slug", "gpuci")),
        name=str(entry.get("name", entry.get("slug", "gpuci"))),
        owner=str(entry.get("owner", "fakehub")),
        public_key_pem=public_pem,
        private_key_pem=private_pem,
        webhook_url=entry.get("webhook_url"),
        webhook_secret=entry.get("webhook_secret"),
        permissions=dict(entry.get("permissions", DEFAULT_PERMISSIONS)),
        events=list(entry.get("events", DEFAULT_EVENTS)),
        bot_user_id=int(entry.get("bot_user_id", 41_000_000 + app_id)),
    )


def _app_key(
    entry: dict[str, Any], base_dir: Path, key_path: Path | None
) -> tuple[bytes | None, bytes]:
    """(private PEM or None, public PEM) from `public_key_path`, `private_key_path` or
    `generate: true` (which writes the new private key to `private_key_path` if given)."""
    where = key_path or (
        base_dir / entry["private_key_path"] if "private_key_path" in entry else None
    )
    if entry.get("generate"):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        if where is not None:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_bytes(private_pem)
            where.chmod(0o600)
        return private_pem, _public_pem(key.public_key())
    if "public_key_path" in entry:
        return None, (base_dir / entry["public_key_path"]).read_bytes()
    if where is None:
        raise WorldError("world file: app needs private_key_path, public_key_path or generate")
    private_pem = where.read_bytes()
    loaded = serialization.load_pem_private_key(private_pem, password=None)
    return private_pem, _public_pem(loaded.public_key())


def _public_pem(public_key: Any) -> bytes:
    pem: bytes = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem


def read_files(spec: Any, base_dir: Path) -> dict[str, bytes]:
    """A files map ({path: text}) or a directory (every file under it, by relative path)."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return {str(k): _content(v) for k, v in spec.items() if v is not None}
    root = (base_dir / str(spec)).resolve()
    if not root.is_dir():
        raise WorldError(f"world file: {spec!r} is not a directory")
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not _ignored(p.relative_to(root))
    }


def _ignored(relative: Path) -> bool:
    return any(part in {".git", "__pycache__", ".pytest_cache"} for part in relative.parts)


def _content(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _add_repo(world: World, entry: dict[str, Any], base_dir: Path) -> None:
    full_name = str(_require(entry, "full_name"))
    owner, _, name = full_name.partition("/")
    fork_of = entry.get("fork_of")
    files = read_files(entry.get("files"), base_dir)
    if fork_of and "files" not in entry:
        parent = world.repos[fork_of]
        files = dict(world.commits[parent.branches[parent.default_branch]].files)
    default_branch = str(entry.get("default_branch", "main"))
    root = world.add_commit(files, [], "Initial commit", owner)
    repo = Repo(
        id=int(entry.get("id", world.next_id())),
        owner=owner,
        name=name,
        default_branch=default_branch,
        private=bool(entry.get("private", False)),
        fork_of=fork_of,
        branches={default_branch: root.sha},
        collaborators={
            str(k): _role(v, full_name) for k, v in entry.get("collaborators", {}).items()
        },
    )
    world.repos[full_name] = repo
    for source, spec in (entry.get("sources") or {}).items():
        changed = read_files(spec, base_dir)
        commit = world.add_commit({**files, **changed}, [root.sha], f"{source}", owner)
        repo.branches[str(source)] = commit.sha


def _role(value: Any, repo: str) -> str:
    if value not in ROLES:
        raise WorldError(f"world file: repos[{repo}].collaborators: role {value!r} not in {ROLES}")
    return str(value)


def open_pull(world: World, entry: dict[str, Any], *, base_dir: Path) -> Pull:
    """Open a pull request from a world-file or control-API entry:
    {number?, repo, base?, head: {repo?, ref, sha? | source? | files?}, author, title?, draft?}."""
    repo = world.repos[str(_require(entry, "repo"))]
    head = dict(_require(entry, "head"))
    head_repo = world.repos[str(head.get("repo", repo.full_name))]
    ref = str(_require(head, "ref"))
    base_ref = str(entry.get("base", repo.default_branch))
    base_sha = repo.branches[base_ref]
    head_sha = _head_commit(world, head_repo, head, ref, base_sha, base_dir, entry)
    head_repo.branches[ref] = head_sha
    number = int(entry.get("number", _next_number(world, repo)))
    pull = Pull(
        id=world.next_id(),
        number=number,
        repo=repo.full_name,
        head_repo=head_repo.full_name,
        head_owner=head_repo.owner,
        head_ref=ref,
        head_sha=head_sha,
        base_ref=base_ref,
        base_sha=base_sha,
        author=str(_require(entry, "author")),
        title=str(entry.get("title", f"Pull request from {ref}")),
        body=str(entry.get("body", "")),
        draft=bool(entry.get("draft", False)),
        labels=list(entry.get("labels", [])),
    )
    world.pulls[(repo.full_name, number)] = pull
    return pull


def _head_commit(
    world: World,
    head_repo: Repo,
    head: dict[str, Any],
    ref: str,
    base_sha: str,
    base_dir: Path,
    entry: dict[str, Any],
) -> str:
    if "sha" in head:
        if head["sha"] not in world.commits:
            raise WorldError(f"pull head sha {head['sha']!r} is not a known commit")
        return str(head["sha"])
    source = head.get("source", ref if ref in head_repo.branches else None)
    if source is not None and "files" not in head:
        if source not in head_repo.branches:
            raise WorldError(f"repos[{head_repo.full_name}] has no source {source!r}")
        return head_repo.branches[source]
    changed = read_files(head.get("files"), base_dir)
    files = {**world.commits[base_sha].files, **changed}
    author = str(entry.get("author", head_repo.owner))
    return world.add_commit(files, [base_sha], f"Changes on {ref}", author).sha


def _next_number(world: World, repo: Repo) -> int:
    taken = [n for (name, n) in world.pulls if name == repo.full_name]
    return max(taken, default=0) + 1


def push(
    world: World, pull: Pull, files: dict[str, Any] | None, message: str | None, author: str
) -> Commit:
    """A new commit on the pull request's head branch: the old head's files with `files`
    applied (a null value deletes the path). WorldError once the head repository is gone."""
    if pull.head_repo is None:
        raise WorldError(f"{pull.repo}#{pull.number}: its head repository was deleted")
    parent = world.commits[pull.head_sha]
    tree = dict(parent.files)
    for path, content in (files or {}).items():
        if content is None:
            tree.pop(path, None)
        else:
            tree[path] = _content(content)
    text = message or f"Push {len(parent.parents) + 1} to {pull.head_ref}"
    commit = world.add_commit(tree, [parent.sha], text, author)
    pull.head_sha = commit.sha
    pull.updated_at = timestamp()
    world.repos[pull.head_repo].branches[pull.head_ref] = commit.sha
    return commit


def push_branch(
    world: World, full_name: str, branch: str, files: dict[str, Any] | None, author: str
) -> Commit:
    """A new commit on a repository's branch (its default branch, say): the branch head's files
    with `files` applied (a null value deletes the path). WorldError for an unknown one."""
    repo = world.repos.get(full_name)
    if repo is None or branch not in repo.branches:
        raise WorldError(f"no branch {branch!r} in {full_name!r}")
    parent = world.commits[repo.branches[branch]]
    tree = dict(parent.files)
    for path, content in (files or {}).items():
        if content is None:
            tree.pop(path, None)
        else:
            tree[path] = _content(content)
    commit = world.add_commit(tree, [parent.sha], f"Push to {branch}", author)
    repo.branches[branch] = commit.sha
    return commit


def delete_repo(world: World, full_name: str) -> list[Pull]:
    """Delete a repository as its owner would: gone from the API and every installation; the
    pull requests it is the head of stay open with no head repository (GitHub then sends
    `head.repo: null`). Their commits stay readable through the base repository, as on
    GitHub. A repository that is a pull request's base, or another's fork parent, cannot be
    deleted here (WorldError). Returns the pull requests left without a head repository."""
    if full_name not in world.repos:
        raise WorldError(f"no repository {full_name!r}")
    if any(pr.repo == full_name for pr in world.pulls.values()):
        raise WorldError(f"{full_name} is a pull request's base repository; not modelled")
    if any(repo.fork_of == full_name for repo in world.repos.values()):
        raise WorldError(f"{full_name} has forks; delete them first")
    del world.repos[full_name]
    for inst in world.installations.values():
        if inst.repositories is not None and full_name in inst.repositories:
            inst.repositories.remove(full_name)
    orphans = [pr for pr in world.pulls.values() if pr.head_repo == full_name]
    for pr in orphans:
        pr.head_repo = None
    return orphans
