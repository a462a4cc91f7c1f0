"""The scheduler's leader lock: one scheduler leads, others stand by, and the lock's token
fences the writes that hand out GPUs, so a leader that lost the lock cannot make them.

The lock is a Redis key with a TTL holding "<term>:<holder>"; each new leader takes the next
term. The leader renews it every round. A standby that finds it gone takes it, within
`ttl_s + TICK_S` of the leader's last renewal. A leader that was paused (SIGSTOP, a long GC, a
partition) past its TTL may wake mid-round: its dispatch script compares the lock with its
token in the same atomic step as the leases, the run's assignment and the ticket, and writes
none of them when they differ.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from redis import Redis

from contract import keys

LEADER_TTL_S = 10.0  # a leader that has not renewed for this long has lost the lock
SEEN_S = 30.0  # a scheduler not seen for this long is no longer listed

# KEYS: lock, term counter. ARGV: holder, ttl ms, the token we hold now or "".
# Renew our own lock; else take a free one with the next term. Returns the token, or nil.
_HOLD = """
local held = redis.call('GET', KEYS[1])
if held and held == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return held
end
if held then return false end
local token = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""

# KEYS: lock. ARGV: token. Drop the lock only if it is ours.
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lock, run hash, pending set, dispatched set, host's ticket list, then the lease keys.
# ARGV: token ("" for none), run id, lease owner, lease ttl ms, ticket, then run field/value
# pairs. All of it or nothing: the fence, the run still pending, no GPU leased to another.
_DISPATCH = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'not leading' end
if redis.call('HGET', KEYS[2], 'state') ~= 'pending' then return 'not pending' end
for i = 6, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= ARGV[3] then return 'leased' end
end
for i = 6, #KEYS do redis.call('SET', KEYS[i], ARGV[3], 'PX', ARGV[4]) end
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('LPUSH', KEYS[5], ARGV[5])
return 'dispatched'
"""


class Dispatched(StrEnum):
    """What the fenced dispatch did."""

    DISPATCHED = "dispatched"
    NOT_LEADING = "not leading"  # the lock holds another token: this scheduler lost it
    NOT_PENDING = "not pending"  # the run changed since it was read (cancelled, assigned)
    LEASED = "leased"  # one of the GPUs is leased to another run since the plan


@dataclass(frozen=True)
class Fence:
    """The token the lock held when this scheduler last renewed it: `<term>:<holder>`."""

    token: str

    @property
    def term(self) -> int:
        return int(self.token.partition(":")[0])

    @property
    def holder(self) -> str:
        return self.token.partition(":")[2]


def new_holder() -> str:
    """A name for this scheduler process: `<hostname>:<pid>:<random>`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Leadership:
    """One scheduler process's claim on the lock."""

    def __init__(self, conn: Redis, holder: str | None = None, ttl_s: float = LEADER_TTL_S):
        self.conn, self.ttl_s = conn, ttl_s
        self.holder = holder or new_holder()
        self.fence: Fence | None = None
        self.renewed_at = 0.0  # time.monotonic() of the last renewal that kept the lock
        self._hold = conn.register_script(_HOLD)

    def hold(self, now: float) -> Fence | None:
        """Renew the lock if this process holds it, take it if it is free; the fence while
        leading, None while standing by. Also marks this process as seen."""
        ours = self.fence.token if self.fence else ""
        token = self._hold(
            [keys.scheduler_leader(), keys.scheduler_term()],
            [self.holder, max(1, round(self.ttl_s * 1000)), ours],
        )
        self.fence = Fence(_text(token)) if token else None
        if self.fence is not None:
            self.renewed_at = time.monotonic()
        pipe = self.conn.pipeline(transaction=False)
        pipe.zadd(keys.schedulers(), {self.holder: now})
        pipe.zremrangebyscore(keys.schedulers(), "-inf", now - SEEN_S)
        pipe.execute()
        return self.fence

    def keep(self) -> Fence | None:
        """The fence, renewing the lock first if a third of its TTL went by since the last
        renewal: a long round (many runs to start, GitHub slow to mint tokens) keeps the lock
        as long as it makes progress. None once the lock is lost."""
        if self.fence is not None and time.monotonic() - self.renewed_at < self.ttl_s / 3:
            return self.fence
        return self.hold(time.time())

    def resign(self) -> None:
        """Give the lock up at once (a clean stop), so a standby need not wait for its TTL."""
        if self.fence is not None:
            self.conn.eval(_RESIGN, 1, keys.scheduler_leader(), self.fence.token)
            self.fence = None
        self.conn.zrem(keys.schedulers(), self.holder)


def still_leads(conn: Redis, fence: Fence | None) -> bool:
    """Whether the lock still holds the fence's token (always, without a fence)."""
    return fence is None or _text(conn.get(keys.scheduler_leader()) or b"") == fence.token


def dispatch(
    conn: Redis,
    fence: Fence | None,
    *,
    run_id: str,
    host: str,
    indices: Sequence[int],
    owner: str,
    lease_ttl_s: float,
    fields: Mapping[str, str],
    ticket: str,
) -> Dispatched:
    """Lease the GPUs, mark the run assigned and give the host its ticket, in one atomic step
    that does nothing unless the lock still holds the fence's token (no fence: no check)."""
    lease_keys = [keys.gpu_lease(host, i) for i in sorted(set(indices))]
    pairs = [part for name, value in fields.items() for part in (name, value)]
    answer = conn.eval(
        _DISPATCH,
        5 + len(lease_keys),
        keys.scheduler_leader(),
        keys.run(run_id),
        keys.pending_runs(),
        keys.dispatched_runs(),
        keys.host_tickets(host),
        *lease_keys,
        fence.token if fence else "",
        run_id,
        owner,
        max(1, round(lease_ttl_s * 1000)),
        ticket,
        *pairs,
    )
    return Dispatched(_text(answer))


@dataclass(frozen=True)
class LeaderView:
    """Who leads and who stands by, for /healthz and the dashboard."""

    leader: str  # the holder, "" when no scheduler holds the lock
    term: int
    expires_in_s: float | None  # until the lock lapses unless renewed
    standby: tuple[str, ...]  # the other schedulers seen lately


def leader_view(conn: Redis, now: float) -> LeaderView:
    pipe = conn.pipeline(transaction=False)
    pipe.get(keys.scheduler_leader())
    pipe.pttl(keys.scheduler_leader())
    pipe.zrangebyscore(keys.schedulers(), now - SEEN_S, "+inf")
    token, ttl_ms, seen = pipe.execute()
    fence = Fence(_text(token)) if token else None
    leader = fence.holder if fence else ""
    standby = tuple(sorted(name for raw in seen if (name := _text(raw)) != leader))
    expires = ttl_ms / 1000 if fence and ttl_ms >= 0 else None
    return LeaderView(leader, fence.term if fence else 0, expires, standby)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
