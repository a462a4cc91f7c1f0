"""Redis failures as an operator reads them, against a real redis-server with gpuci's ACL: a
refused login, a command or key the ACL user may not use and an unreachable server each say
so, never with the password; an unset REDIS_URL says which Redis was read; the operator's
login can troubleshoot (PING, ACL LOG) and write nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import NoPermissionError, ResponseError

from bot.cli import main as gpuci
from bot.redis_local import free_port
from contract import keys
from contract.acl import OPERATOR_USER, acl_file
from contract.redis_errors import connect
from tests.redis_server import PrivateRedis, private_redis_server

HOST = "h20-01"
SECRET = "Sup3rSecretPw"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    aclfile = tmp_path / "gpuci-acl.conf"
    aclfile.write_text(acl_file([HOST]).replace(">CHANGE-ME-", ">"))
    with private_redis_server(tmp_path / "redis", aclfile=aclfile) as found:
        yield found


def runs_with(
    url: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    if url is None:
        monkeypatch.delenv("REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("REDIS_URL", url)
    code = gpuci(["runs"])
    return code, capsys.readouterr().err


def test_a_wrong_password_is_a_refused_login_and_never_printed(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = runs_with(server.url_as("gpuci-bot", SECRET), monkeypatch, capsys)
    assert code == 2
    assert "login refused" in err and "REDIS_URL" in err
    assert "unreachable" not in err
    assert SECRET not in err
    assert f"redis://[redacted]@127.0.0.1:{server.port}/0" in err


def test_a_login_without_a_user_is_a_refused_login(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = runs_with(f"redis://127.0.0.1:{server.port}/0", monkeypatch, capsys)
    assert code == 2 and "login refused" in err and "unreachable" not in err


def test_a_command_the_user_may_not_run_names_the_command_and_key(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host_login = server.url_as(f"gpuci-host-{HOST}", f"host-{HOST}-password")
    code, err = runs_with(host_login, monkeypatch, capsys)
    assert code == 2
    assert f"permission denied: for ZREVRANGE on key {keys.all_runs()}" in err
    assert "unreachable" not in err and f"host-{HOST}-password" not in err


def test_an_unreachable_redis_says_unreachable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = runs_with(
        f"redis://gpuci-bot:{SECRET}@127.0.0.1:{free_port()}/0", monkeypatch, capsys
    )
    assert code == 2 and "unreachable (" in err and SECRET not in err


def test_an_unset_redis_url_says_which_redis_was_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    code, err = runs_with(None, monkeypatch, capsys)
    assert "Redis at redis://127.0.0.1:6379/0 (the default; set REDIS_URL" in err
    assert code in (0, 2)  # whether or not a Redis answers there, the reader learns which


def test_the_operator_login_troubleshoots_and_writes_nothing(server: PrivateRedis) -> None:
    operator = Redis.from_url(server.url_as(OPERATOR_USER, "operator-password"))
    host = connect(server.url_as(f"gpuci-host-{HOST}", f"host-{HOST}-password"))
    bot = Redis.from_url(server.url)
    bot.set(keys.hosts(), "x")
    assert operator.ping() is True
    assert operator.get(keys.hosts()) == b"x"
    assert "redis_version" in operator.info()
    with pytest.raises(NoPermissionError):
        host.get("gpuci:run:1")  # a host may not read runs: ACL LOG tells the operator
    entries = operator.acl_log()
    assert any(
        e["username"] == f"gpuci-host-{HOST}" and e["object"] == "gpuci:run:1" for e in entries
    ), entries
    for write in (
        lambda: operator.set("gpuci:x", "1"),
        lambda: operator.delete(keys.hosts()),
        lambda: operator.flushall(),
        lambda: operator.config_set("appendonly", "no"),
        lambda: operator.acl_setuser("intruder", enabled=True),
    ):
        with pytest.raises(ResponseError, match=r"NOPERM|no permissions"):
            write()
    assert bot.get(keys.hosts()) == b"x"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"redis://gpuci-bot:{SECRET}@127.0.0.1:63o9/0", "its port is not a number"),
        (f"http://gpuci-bot:{SECRET}@127.0.0.1:6379/0", "it must start with redis://"),
        (f"redis://gpuci-bot:{SECRET}@127.0.0.1:6379/zero", "its database 'zero' is not a number"),
    ],
)
def test_a_malformed_redis_url_is_refused_without_a_traceback_or_its_password(
    url: str,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = runs_with(url, monkeypatch, capsys)
    assert code == 2
    assert f"REDIS_URL='{url.split('://')[0]}://[redacted]@" in err and problem in err
    assert SECRET not in err and "Traceback" not in err
