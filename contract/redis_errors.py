"""What a Redis failure means to an operator, said without a password: the login refused, a
command or key the ACL user may not use, the server unreachable, or another error; and which
Redis that was (its URL redacted, and whether it is only the default)."""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contract.redact import redact_text, redact_url
from contract.settings import DEFAULT_REDIS_URL

_LOGIN_REFUSED = ("WRONGPASS", "NOAUTH", "invalid username-password", "must be called with the")


def redis_problem(exc: RedisError) -> str:
    """The failure in words: "login refused (...)", "permission denied for ...", "unreachable
    (...)", "still loading its data" or "error: ..."; never a password."""
    text = redact_text(str(exc))
    if isinstance(exc, NoPermissionError) or text.startswith("NOPERM"):
        return f"permission denied: {text.removeprefix('NOPERM ')}"
    if isinstance(exc, AuthenticationError) or any(mark in text for mark in _LOGIN_REFUSED):
        return f"login refused ({text}): check the user and password in REDIS_URL"
    if isinstance(exc, BusyLoadingError):
        return "still loading its data after a restart; try again in a moment"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return f"unreachable ({text})"
    return f"error: {text}"


def which_redis(url: str) -> str:
    """`Redis at URL` (redacted), saying so when it is REDIS_URL's default."""
    where = f"Redis at {redact_url(url)}"
    if url == DEFAULT_REDIS_URL:
        return f"{where} (the default; set REDIS_URL to use another)"
    return where


def describe(exc: RedisError, url: str) -> str:
    """One line for an operator: which Redis, and what went wrong there."""
    return f"{which_redis(url)}: {redis_problem(exc)}"


class NamingRedis(Redis):
    """A client whose refused commands name the command and its key (Redis names neither for
    a key the ACL user may not touch)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)
        except NoPermissionError as exc:
            command = str(args[0]).upper() if args else "?"
            key = f" on key {_text(args[1])}" if len(args) > 1 else ""
            raise NoPermissionError(f"for {command}{key}: {exc}") from exc


def connect(url: str, **options: Any) -> Redis:
    """A client for the command line's tools (`gpuci runs`, `gpuci gpus`, ...)."""
    return NamingRedis.from_url(url, **options)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
