"""The GitHub App: App JWT, installation clients and tokens, retries, and the REST calls used."""

from __future__ import annotations

import base64
import logging
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from github import Auth, Github, GithubException, GithubIntegration, GithubRetry
from github.GithubException import RateLimitExceededExceedsMaxWait
from urllib3.response import BaseHTTPResponse

from bot.timestamps import epoch
from contract.settings import Settings

log = logging.getLogger("gpuci.github")

# GitHub answers these before doing anything, so even a POST may be sent again.
NOT_PROCESSED = frozenset({403, 429})
SOURCE_PERMISSIONS = {"contents": "read"}  # all a GPU host may do with a source token
# For approved fork code, the host also re-reads the PR before it runs it (workers/host.py).
RECHECK_PERMISSIONS = {**SOURCE_PERMISSIONS, "pull_requests": "read"}
SOURCE_TOKEN_MARGIN_S = 15 * 60  # a cached source token is reused while it has this much left


class GitHubAppError(ValueError):
    """The App's settings are missing or unusable; the message names the variable."""


class AppRetry(GithubRetry):
    """PyGithub's retry (5xx, rate-limited 403 and 429 with backoff, honouring `Retry-After` and
    `X-RateLimit-Reset`), except that a POST is sent again only when GitHub refused it unread
    (rate limits): a POST answered 5xx may have been done, so callers make creates idempotent."""

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if method.upper() == "POST" and status_code not in NOT_PROCESSED:
            return False
        return bool(super().is_retry(method, status_code, has_retry_after))

    def get_retry_after(self, response: BaseHTTPResponse) -> float | None:
        """`Retry-After`, else the wait until `X-RateLimit-Reset` once the limit is used up;
        a wait longer than `max_rate_limit_wait` raises instead of blocking the worker."""
        wait = super().get_retry_after(response)
        reset = response.headers.get("X-RateLimit-Reset", "")
        if wait is None and response.headers.get("X-RateLimit-Remaining") == "0":
            wait = max(0.0, int(reset) - time.time()) + 1 if reset.isdigit() else None
        limit = self.max_rate_limit_wait
        if wait is not None and limit is not None and wait > limit:
            headers = dict(response.headers)
            message = {"message": f"rate limited for {wait:.0f} s, more than gpuci waits"}
            raise RateLimitExceededExceedsMaxWait(response.status, message, headers, wait=wait)
        return wait


def app_retry(total: int = 5, backoff_factor: float = 1.0, max_wait_s: float = 300) -> AppRetry:
    """The retry every GitHub request of gpuci goes through. Waits longer than `max_wait_s`
    (a far rate-limit reset) fail instead of blocking the worker."""
    return AppRetry(
        total=total,
        backoff_factor=backoff_factor,
        status_forcelist=[*range(500, 600), 429],
        allowed_methods=AppRetry.DEFAULT_ALLOWED_METHODS | {"GET", "PATCH", "POST"},
        secondary_rate_wait=min(60.0, max_wait_s),
        max_rate_limit_wait=max_wait_s,
        respect_retry_after_header=True,
    )


class GitHubApp:
    """One GitHub App: its JWT, an installation client per installation (tokens cached by
    PyGithub until 20 s before they expire), and repository-scoped source tokens."""

    def __init__(
        self,
        api_url: str,
        app_id: int | str,
        private_key_pem: str,
        *,
        retry: AppRetry | None = None,
        write_interval_s: float = 1.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._options: dict[str, Any] = {
            "base_url": self.api_url,
            "retry": retry or app_retry(),
            "seconds_between_requests": 0,
            "seconds_between_writes": write_interval_s,
        }
        self.integration = GithubIntegration(
            auth=Auth.AppAuth(app_id, private_key_pem), **self._options
        )
        self._clients: dict[int, Github] = {}
        self._installations: dict[str, int] = {}
        self._slug: str | None = None
        self._source_tokens: dict[tuple[int, str, bool], tuple[str, float]] = {}
        self.meter: Meter = _no_meter  # replace to count calls (the events worker: in Redis)

    @classmethod
    def from_settings(cls, settings: Settings, *, retry: AppRetry | None = None) -> GitHubApp:
        """From GPUCI_APP_ID, GPUCI_PRIVATE_KEY_PATH and GPUCI_GITHUB_API_URL."""
        if not settings.app_id.strip().isdigit():
            raise GitHubAppError(
                f"GPUCI_APP_ID must be the GitHub App's numeric id, got {settings.app_id!r}"
            )
        if not settings.private_key_path:
            raise GitHubAppError("GPUCI_PRIVATE_KEY_PATH must name the App's private key (PEM)")
        pem = _read_key(Path(settings.private_key_path))
        return cls(
            settings.github_api_url,
            int(settings.app_id),
            pem,
            retry=retry,
            write_interval_s=settings.github_write_interval_s,
        )

    @property
    def bot_login(self) -> str:
        """`<slug>[bot]`, the login the App's own comments and labels carry (GET /app once)."""
        if self._slug is None:
            self._slug = str(self.integration.get_app().slug)
        return f"{self._slug}[bot]"

    def installation_for(self, repo_full_name: str) -> int:
        """The installation id of the App on a repository (GET /repos/{o}/{r}/installation)."""
        key = repo_full_name.lower()
        if key not in self._installations:
            owner, _, name = repo_full_name.partition("/")
            self._installations[key] = self.integration.get_repo_installation(owner, name).id
        return self._installations[key]

    def client(self, installation_id: int) -> Github:
        """A PyGithub client acting as the installation; one per installation, reused."""
        if installation_id not in self._clients:
            self._clients[installation_id] = self.integration.get_github_for_installation(
                installation_id
            )
        return self._clients[installation_id]

    def repo(self, installation_id: int, full_name: str) -> RepoClient:
        return RepoClient(self.client(installation_id), full_name, self.meter)

    def source_token(self, installation_id: int, repo_name: str, *, recheck: bool = False) -> str:
        """An installation token for one repository with `contents: read` only (and, with
        `recheck`, `pull_requests: read`, for a host to re-read the PR of approved fork code):
        what a GPU host gets, and nothing more. Reused while it has more than
        SOURCE_TOKEN_MARGIN_S left (its scope is the same for every such run of the repo)."""
        name = repo_name.rpartition("/")[2]
        permissions = RECHECK_PERMISSIONS if recheck else SOURCE_PERMISSIONS
        cached = self._source_tokens.get((installation_id, name, recheck))
        if cached and cached[1] - time.time() > SOURCE_TOKEN_MARGIN_S:
            return cached[0]
        _, data = self.integration.requester.requestJsonAndCheck(
            "POST",
            f"/app/installations/{installation_id}/access_tokens",
            input={"repositories": [name], "permissions": permissions},
        )
        self.meter("POST", "2xx", -1)
        token = str(data["token"])
        expires = epoch(data.get("expires_at")) or time.time() + 3600
        self._source_tokens[(installation_id, name, recheck)] = (token, expires)
        return token


def _read_key(path: Path) -> str:
    try:
        pem = path.read_text()
    except OSError as exc:
        raise GitHubAppError(f"GPUCI_PRIVATE_KEY_PATH={path}: cannot read it ({exc})") from None
    if "PRIVATE KEY-----" not in pem:
        raise GitHubAppError(f"GPUCI_PRIVATE_KEY_PATH={path}: not a PEM private key")
    return pem


# Told of every REST call: (method, "2xx", an HTTP error status or "none" for no answer,
# the rate-limit budget GitHub last reported or -1).
Meter = Callable[[str, str, int], None]


def _no_meter(method: str, status: str, remaining: int) -> None:
    return None


@dataclass(frozen=True)
class RepoClient:
    """The REST calls the events worker makes on one repository, as plain JSON."""

    gh: Github
    full_name: str
    meter: Meter = _no_meter

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        status = "none"
        try:
            _, data = self.gh.requester.requestJsonAndCheck(
                method, f"/repos/{self.full_name}{path}", **kw
            )
            status = "2xx"
        except GithubException as exc:
            status = str(exc.status)
            raise
        finally:
            self.meter(method, status, self.gh.requester.rate_limiting[0])
        return data

    def default_head(self) -> tuple[str, str]:
        """(default branch, the SHA at its head)."""
        branch = str(self._call("GET", "")["default_branch"])
        found = self._call("GET", f"/branches/{_quote(branch)}")
        return branch, str(found["commit"]["sha"])

    def pull(self, number: int) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", f"/pulls/{number}")
        return found

    def file_text(self, path: str, ref: str) -> str | None:
        """A file's text at `ref`; None when it does not exist there."""
        try:
            data = self._call(
                "GET", f"/contents/{urllib.parse.quote(path)}", parameters={"ref": ref}
            )
        except GithubException as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(data, dict) or data.get("type") != "file":
            return None
        return base64.b64decode(data.get("content") or "").decode("utf-8", "replace")

    def role_of(self, login: str) -> tuple[str | None, str | None]:
        """(role_name, permission) of a user on this repository; (None, None) for no user."""
        try:
            data = self._call("GET", f"/collaborators/{_quote(login)}/permission")
        except GithubException as exc:
            if exc.status == 404:
                return None, None
            raise
        return data.get("role_name"), data.get("permission")

    def create_check_run(self, body: dict[str, Any], attempts: int = 3) -> int:
        """Create a check run (`body` has an `external_id`). A POST answered 5xx may have been
        done: before sending it again, look for a run with that external_id at that commit."""
        for attempt in range(1, attempts + 1):
            try:
                return int(self._call("POST", "/check-runs", input=body)["id"])
            except GithubException as exc:
                if exc.status < 500 or attempt == attempts:
                    raise
                log.warning("creating check run %r: %s; looking it up", body["name"], exc.status)
            found = self.find_check_run(body["head_sha"], body["name"], body["external_id"])
            if found is not None:
                return found
            time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def update_check_run(self, check_run_id: int, body: dict[str, Any]) -> None:
        self._call("PATCH", f"/check-runs/{check_run_id}", input=body)

    def find_check_run(self, sha: str, name: str, external_id: str) -> int | None:
        """The newest check run called `name` at `sha` that gpuci made for `external_id`."""
        params = {"check_name": name, "filter": "all", "per_page": 100}
        data = self._call("GET", f"/commits/{sha}/check-runs", parameters=params)
        found = [r for r in data.get("check_runs", []) if r.get("external_id") == external_id]
        return max((int(r["id"]) for r in found), default=None)

    def comment(self, number: int, body: str) -> int:
        return int(self._call("POST", f"/issues/{number}/comments", input={"body": body})["id"])

    def react(self, comment_id: int, content: str) -> None:
        """A reaction; GitHub keeps one per user and content, so repeating it is harmless."""
        self._call("POST", f"/issues/comments/{comment_id}/reactions", input={"content": content})

    def remove_label(self, number: int, label: str) -> bool:
        """Remove a label from a PR; False when it was not there (404)."""
        try:
            self._call("DELETE", f"/issues/{number}/labels/{_quote(label)}")
        except GithubException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
