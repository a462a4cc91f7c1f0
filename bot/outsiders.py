"""Commands from users without write access: their role remembered briefly, one reply per user
per PR per hour, and nothing else spent on them (no PR fetch, no config, no reaction).

Authorization stays the permission API's answer, never the payload's `author_association`;
only an answer below write is remembered, so a revoked writer is refused at once and a new one
waits at most `ROLE_TTL_S`."""

from __future__ import annotations

from redis import Redis

from bot.github_app import RepoClient
from contract import keys
from contract.roles import Role, role_from_api

ROLE_TTL_S = 60
REPLY_WINDOW_S = 3600


def role_of(conn: Redis, gh: RepoClient, repo: str, login: str) -> Role:
    """The user's role on `repo`: remembered if below write, else asked of GitHub each time."""
    key = keys.role_below_write(repo, login)
    known = conn.get(key)
    if isinstance(known, bytes):
        return Role(known.decode())
    role = role_from_api(*gh.role_of(login)) if login else Role.NONE
    if not role.can_write:
        conn.set(key, str(role), ex=ROLE_TTL_S)
    return role


def may_reply(conn: Redis, repo: str, number: int, login: str, delivery_id: str) -> bool:
    """Whether this delivery's refusal gets a reply: the first one for this user on this PR
    within `REPLY_WINDOW_S` (and that same delivery when it is handled again)."""
    key = keys.refusal_reply(repo, number, login)
    if conn.set(key, delivery_id, nx=True, ex=REPLY_WINDOW_S):
        return True
    return conn.get(key) == delivery_id.encode()
