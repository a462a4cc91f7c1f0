"""The Redis ACL file of a gpuci deployment: the bot processes' user, an operator's login for
looking (redis-cli), and one user per GPU host whose keys and commands are exactly that host's
own (contract/keys.py, contract/hostlink.py)."""

from __future__ import annotations

from collections.abc import Sequence

from contract import keys
from contract.hostlink import check_host_name

BOT_USER = "gpuci-bot"
OPERATOR_USER = "gpuci-operator"
# What an operator troubleshooting gpuci does with redis-cli (docs/deploy.md): read any key,
# ping, INFO, CLIENT LIST, SLOWLOG, and ACL LOG (which names a refused command and key), ACL
# WHOAMI and ACL LOAD (reload the root-owned ACL file after editing it). It writes nothing.
OPERATOR_COMMANDS = (
    "+@read", "+@connection", "+info", "+dbsize", "+client|list", "+slowlog|get",
    "+latency|latest", "+acl|log", "+acl|whoami", "+acl|users", "+acl|load",
)  # fmt: skip
# What a GPU host's worker does with Redis: its record and heartbeat (HSET, SET EX), its
# leases (the Lua scripts of contract/leases.py: GET, PEXPIRE, DEL inside EVALSHA), tickets
# (BLMOVE, LMOVE, LRANGE, LREM, LPUSH, DEL), messages (LPUSH), cancellations (SISMEMBER,
# SREM), its JUnit uploads (SET), pipelines (MULTI, EXEC), and redis-py's connection setup.
HOST_COMMANDS = (
    "ping", "select", "hello", "auth", "client|setname", "client|getname", "client|id",
    "get", "mget", "set", "del", "exists", "expire", "pexpire", "hset", "hget", "hgetall",
    "lpush", "lrange", "lrem", "lmove", "blmove", "llen", "sismember", "srem",
    "eval", "evalsha", "script|load", "script|exists", "multi", "exec", "discard",
)  # fmt: skip


def acl_file(hosts: Sequence[str]) -> str:
    """The ACL file for these GPU hosts; every password a `CHANGE-ME-...` placeholder."""
    lines = [
        "user default off",
        f"user {BOT_USER} on >CHANGE-ME-bot-password ~* &* +@all -@dangerous +info +client|list",
        operator_user_line(),
    ]
    lines += [host_user_line(name) for name in hosts]
    return "\n".join(lines) + "\n"


def operator_user_line() -> str:
    """The operator's login: everything readable, nothing writable (-@write after +@read)."""
    commands = " ".join(OPERATOR_COMMANDS)
    login = f"user {OPERATOR_USER} on >CHANGE-ME-operator-password"
    return f"{login} ~* resetchannels -@all {commands} -@write"


def host_user(name: str) -> str:
    return f"gpuci-host-{check_host_name(name)}"


def host_user_line(name: str) -> str:
    """One host's user: its own keys, the commands above, and a selector that lets it add its
    name to the set of hosts (SADD only: it cannot remove another)."""
    own = " ".join(f"~{pattern}" for pattern in keys.host_keys(check_host_name(name)))
    commands = " ".join(f"+{command}" for command in HOST_COMMANDS)
    hosts_set = f"(~{keys.hosts()} +sadd)"
    return (
        f"user {host_user(name)} on >CHANGE-ME-host-{name}-password resetkeys {own} "
        f"resetchannels -@all {commands} {hosts_set}"
    )
