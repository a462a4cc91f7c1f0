"""GPU leases in Redis: all of a run's GPUs or none, owner-checked, kept alive by a heartbeat."""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from redis import Redis
from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from contract import keys

log = logging.getLogger("gpuci.leases")

RETRY_S = 1.0  # how often a renewal is retried while Redis is unreachable
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)  # Redis down, restarting or loading

# KEYS: lease keys; ARGV: owner, ttl ms. Set all (ours again included) only if none is foreign.
_ACQUIRE = """
for _, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder and holder ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS: lease keys; ARGV: owner, ttl ms. Extend all only if every one is still ours.
_RENEW = """
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"""

# KEYS: lease keys; ARGV: owner. Delete the ones we hold; return how many.
_RELEASE = """
local released = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    released = released + 1
  end
end
return released
"""

_scripts: weakref.WeakKeyDictionary[Redis, dict[str, Script]] = weakref.WeakKeyDictionary()
_scripts_lock = threading.Lock()


def new_owner(run_id: str) -> str:
    """A lease owner token unique to this attempt of the run: `<run_id>:<random hex>`."""
    return f"{run_id}:{uuid.uuid4().hex}"


def run_of(owner: str) -> str:
    """The run id inside an owner token made by `new_owner`."""
    return owner.rpartition(":")[0] or owner


def acquire(conn: Redis, host: str, indices: Iterable[int], owner: str, ttl_s: float) -> bool:
    """Lease every GPU in `indices` to `owner` for `ttl_s`, or none if any is held by another."""
    return bool(_script(conn, "acquire")(_lease_keys(host, indices), [owner, _ms(ttl_s)]))


def renew(conn: Redis, host: str, indices: Iterable[int], owner: str, ttl_s: float) -> bool:
    """Extend the leases to `ttl_s` from now, only if `owner` still holds every one."""
    return bool(_script(conn, "renew")(_lease_keys(host, indices), [owner, _ms(ttl_s)]))


def release(conn: Redis, host: str, indices: Iterable[int], owner: str) -> int:
    """Drop the leases `owner` holds among `indices`; another owner's are left alone."""
    return int(_script(conn, "release")(_lease_keys(host, indices), [owner]))


def holders(conn: Redis, host: str, indices: Iterable[int]) -> dict[int, str | None]:
    """Who holds each GPU: its owner token, or None when free."""
    wanted = sorted(set(indices))
    values = conn.mget([keys.gpu_lease(host, i) for i in wanted]) if wanted else []
    return {i: _text(v) for i, v in zip(wanted, values, strict=True)}


def _lease_keys(host: str, indices: Iterable[int]) -> list[str]:
    return [keys.gpu_lease(host, i) for i in sorted(set(indices))]


def _ms(ttl_s: float) -> int:
    if ttl_s <= 0:
        raise ValueError(f"lease TTL must be positive, not {ttl_s}")
    return max(1, round(ttl_s * 1000))


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _script(conn: Redis, name: str) -> Script:
    """The lease scripts, registered once per connection."""
    with _scripts_lock:
        scripts = _scripts.get(conn)
        if scripts is None:
            sources = {"acquire": _ACQUIRE, "renew": _RENEW, "release": _RELEASE}
            scripts = {key: conn.register_script(src) for key, src in sources.items()}
            _scripts[conn] = scripts
    return scripts[name]


class LeaseHeartbeat:
    """Renews a held lease every ttl/3 in a daemon thread until stopped.

    While Redis is unreachable (a restart) renewal is retried every second or so: the lease is
    still ours in Redis until its TTL runs out. If a renewal finds the lease gone or taken, or
    no renewal got through for a whole TTL, `lost` is set and `reason` says why; the run must
    then stop using the GPUs.
    """

    def __init__(
        self, conn: Redis, host: str, indices: Iterable[int], owner: str, ttl_s: float
    ) -> None:
        self.conn, self.host, self.owner, self.ttl_s = conn, host, owner, ttl_s
        self.indices = sorted(set(indices))
        self.interval_s = ttl_s / 3
        self.retry_s = min(RETRY_S, self.interval_s / 2)
        self.lost = threading.Event()
        self.reason: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"lease-heartbeat {owner}", daemon=True
        )

    def start(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> LeaseHeartbeat:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _beat(self) -> None:
        renewed_at, wait_s = time.monotonic(), self.interval_s  # its holder just took it
        while not self._stopping.wait(wait_s):
            tried_at = time.monotonic()
            try:
                held = renew(self.conn, self.host, self.indices, self.owner, self.ttl_s)
            except RedisError as exc:
                reason = self._unrenewed(exc, tried_at - renewed_at)
                if reason is None:
                    wait_s = self.retry_s
                    continue
            else:
                reason = None if held else self._lost_reason()
            if reason is not None:
                self.reason = reason
                self.lost.set()
                return
            if wait_s != self.interval_s:
                log.info("lease %s on %s: renewed again", self.owner, self.host)
            renewed_at, wait_s = tried_at, self.interval_s

    def _unrenewed(self, error: RedisError, since_s: float) -> str | None:
        """None while the lease may still be ours (log and retry), else why it is lost."""
        if since_s >= self.ttl_s:
            return (
                f"lease on {self.host} GPUs {self.indices} not renewed: Redis error: {error} "
                f"(no renewal for {since_s:.0f} s, its TTL is {self.ttl_s:g} s)"
            )
        trouble = "unreachable" if isinstance(error, UNREACHABLE) else "error"
        log.warning(
            "lease %s on %s GPUs %s not renewed: Redis %s (%s); retrying in %.1f s, lost in %.0f s",
            self.owner, self.host, self.indices, trouble, error, self.retry_s, self.ttl_s - since_s,
        )  # fmt: skip
        return None

    def _lost_reason(self) -> str:
        try:
            now = holders(self.conn, self.host, self.indices)
        except RedisError as exc:
            return f"lease on {self.host} GPUs {self.indices} lost ({exc})"
        gone = [f"GPU {i} {_holder_words(now[i])}" for i in self.indices if now[i] != self.owner]
        return f"lease on {self.host} lost: " + ", ".join(gone)


def _holder_words(holder: str | None) -> str:
    return "expired or released" if holder is None else f"now held by {holder}"
