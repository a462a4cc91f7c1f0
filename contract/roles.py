"""Who a GitHub user is on a repository, as the permission API says, and what a commit SHA is:
what the bot's trust policy and a GPU host's re-check before fork code both go by."""

from __future__ import annotations

import re
from enum import StrEnum

_SHA = re.compile(r"[0-9a-f]{40}")


def is_sha(s: object) -> bool:
    """Exactly 40 lowercase hex characters: a full commit SHA, nothing a branch name could be."""
    return isinstance(s, str) and _SHA.fullmatch(s) is not None


class Role(StrEnum):
    """A user's role on the base repository (the permission API's `role_name`)."""

    NONE = "none"
    READ = "read"
    TRIAGE = "triage"
    WRITE = "write"
    MAINTAIN = "maintain"
    ADMIN = "admin"

    @property
    def can_write(self) -> bool:
        """Write, maintain and admin may approve, label and command; the rest may not."""
        return self in (Role.WRITE, Role.MAINTAIN, Role.ADMIN)


def role_from_api(role_name: str | None, permission: str | None = None) -> Role:
    """The Role from `GET /repos/{owner}/{repo}/collaborators/{user}/permission`.

    A built-in `role_name` is used as is; a custom role name falls back to the legacy
    `permission` field (admin/write/read/none); anything unrecognised is NONE.
    """
    for value in (role_name, permission):
        try:
            return Role((value or "").strip().lower())
        except ValueError:
            continue
    return Role.NONE
