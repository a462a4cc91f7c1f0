"""Who is calling: App JWTs (RS256, checked as GitHub checks them) and installation tokens,
scoped to repositories and permissions; the permission each operation needs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt

from fakehub.world import Installation, Repo, Token, World

MAX_JWT_LIFETIME = 600  # seconds between iat and exp
CLOCK_DRIFT = 60  # seconds iat may lie in the future
TOKEN_LIFETIME = timedelta(hours=1)
_LEVEL = {"read": 1, "write": 2, "admin": 3}

# operationId -> the installation permission it needs; "jwt" marks App-authenticated endpoints.
NEEDS: dict[str, tuple[str, str]] = {
    "apps/get-authenticated": ("jwt", ""),
    "apps/list-webhook-deliveries": ("jwt", ""),
    "apps/redeliver-webhook-delivery": ("jwt", ""),
    "apps/create-installation-access-token": ("jwt", ""),
    "apps/get-repo-installation": ("jwt", ""),
    "checks/create": ("checks", "write"),
    "checks/update": ("checks", "write"),
    "checks/get": ("checks", "read"),
    "checks/list-for-ref": ("checks", "read"),
    "repos/get-collaborator-permission-level": ("metadata", "read"),
    "repos/get-content": ("contents", "read"),
    "repos/download-tarball-archive": ("contents", "read"),
    "repos/get-commit": ("contents", "read"),
    "repos/get-branch": ("contents", "read"),
    "repos/get": ("metadata", "read"),
    "issues/create-comment": ("issues", "write"),
    "issues/list-labels-on-issue": ("issues", "read"),
    "issues/add-labels": ("issues", "write"),
    "issues/remove-label": ("issues", "write"),
    "reactions/create-for-issue-comment": ("issues", "write"),
    "pulls/get": ("pull_requests", "read"),
    "orgs/check-membership-for-user": ("members", "read"),
}
# On pull requests GitHub accepts the pull_requests permission for the issue endpoints too.
ALTERNATIVE = {"issues": "pull_requests"}


class AuthError(Exception):
    """A request GitHub would refuse: status 401 (who are you) or 403 (not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def credentials(header: str | None) -> str:
    """The credential from `Authorization: Bearer X` or `Authorization: token X`."""
    if not header:
        raise AuthError(401, "Requires authentication")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() not in {"bearer", "token"} or not value.strip():
        raise AuthError(401, "Bad credentials")
    return value.strip()


def verify_app_jwt(world: World, token: str, at: datetime | None = None) -> None:
    """Accept a JWT only as GitHub does: RS256 with the App's key, issued by the App id, iat at
    most 60 s ahead, exp not passed and at most 10 minutes after iat."""
    moment = int((at or datetime.now(UTC)).timestamp())
    try:
        claims = jwt.decode(
            token,
            world.app.public_key_pem,
            algorithms=["RS256"],
            options={"verify_exp": False, "verify_iat": False, "require": ["iat", "exp", "iss"]},
        )
    except jwt.InvalidTokenError as exc:
        raise AuthError(401, f"A JSON web token could not be decoded ({exc})") from exc
    iat, exp = int(claims["iat"]), int(claims["exp"])
    if str(claims["iss"]) != str(world.app.id):
        raise AuthError(401, f"'Issuer' claim ('iss') must be the App id {world.app.id}")
    if iat > moment + CLOCK_DRIFT:
        raise AuthError(
            401, "'Issued at' claim ('iat') must be an Integer representing a time in the past"
        )
    if exp - iat > MAX_JWT_LIFETIME:
        raise AuthError(401, "'Expiration time' claim ('exp') is too far in the future")
    if exp <= moment:
        raise AuthError(
            401,
            "'Expiration time' claim ('exp') must be a numeric value representing the future "
            "time at which the assertion expires",
        )


def issue_token(world: World, inst: Installation, body: dict[str, Any]) -> Token:
    """A new installation token, narrowed to `repositories`/`repository_ids` and `permissions`
    when the request names them; asking for more than the installation has is refused (422)."""
    repos = _requested_repos(world, inst, body)
    permissions = dict(inst.permissions)
    if body.get("permissions"):  # an empty object asks for everything, as on GitHub
        for name, level in body["permissions"].items():
            if _LEVEL.get(inst.permissions.get(name, ""), 0) < _LEVEL[level]:
                raise AuthError(
                    422, "The permissions requested are not granted to this installation."
                )
        permissions = dict(body["permissions"])
    token = Token(
        token="ghs_" + secrets.token_urlsafe(27).replace("-", "A").replace("_", "b")[:36],
        installation_id=inst.id,
        repositories=repos,
        permissions=permissions,
        expires_at=datetime.now(UTC).replace(microsecond=0) + TOKEN_LIFETIME,
    )
    world.tokens[token.token] = token
    return token


def _requested_repos(world: World, inst: Installation, body: dict[str, Any]) -> set[str] | None:
    if "repositories" not in body and "repository_ids" not in body:
        return None
    accessible = {r.full_name: r for r in world.repos.values() if world.installation_for(r) is inst}
    wanted = {f"{inst.account}/{name}" for name in body.get("repositories", [])}
    by_id = {r.id: name for name, r in accessible.items()}
    for ident in body.get("repository_ids", []):
        wanted.add(by_id.get(ident, f"#{ident}"))
    if not wanted <= accessible.keys():
        raise AuthError(
            422,
            "There is at least one repository that does not exist or is not accessible "
            "to the parent installation.",
        )
    return wanted


def installation_token(world: World, value: str) -> Token:
    token = world.tokens.get(value)
    if token is None or token.expires_at <= datetime.now(UTC):
        raise AuthError(401, "Bad credentials")
    return token


@dataclass(frozen=True)
class Access:
    """What a request is allowed: the App itself (JWT) or an installation token."""

    app: bool
    token: Token | None = None


def check_repo_access(world: World, token: Token, repo: Repo, permission: str, level: str) -> None:
    """GitHub's answer to a token used on a repository: 404 for a private repository it cannot
    see, 403 when it lacks the permission or the repository is outside its scope."""
    inst = world.installations[token.installation_id]
    in_scope = world.installation_for(repo) is inst and (
        token.repositories is None or repo.full_name in token.repositories
    )
    if not in_scope:
        if repo.private:
            raise AuthError(404, "Not Found")
        if level != "read":
            raise AuthError(403, "Resource not accessible by integration")
        return
    if not has_permission(token, permission, level):
        raise AuthError(403, "Resource not accessible by integration")


def has_permission(token: Token, permission: str, level: str) -> bool:
    names = [permission] + ([ALTERNATIVE[permission]] if permission in ALTERNATIVE else [])
    if permission == "metadata":
        return True  # every installation token can read metadata
    return any(_LEVEL.get(token.permissions.get(n, ""), 0) >= _LEVEL[level] for n in names)
