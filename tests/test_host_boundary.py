"""The GPU-host boundary, attacked with a host's own Redis login: a real redis-server running
the file `gpuci redis-acl` prints, the bot's and two hosts' logins, real runs through fakehub.
Each attack is refused (NOPERM) or has no effect, with the evidence asserted."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import NoPermissionError, ResponseError
from rq import Queue, SimpleWorker

from bot import hostlink, runs, scheduler
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, RunTrigger
from contract import keys, leases
from contract.acl import acl_file
from contract.hostlink import HostMessage, Kind, Ticket
from contract.results import RunReport, Summary
from contract.settings import Settings
from tests.conftest import SAMPLE_REPO, Stack
from tests.redis_server import PrivateRedis, private_redis_server, stack_on
from workers.host import github_refusal, work_burst

E2E_WORLD = Path(__file__).parent / "data" / "world-e2e.yml"
H1, H2 = "sim-h20-01", "sim-h20-02"
SHA = "c" * 40
CONFIG = (SAMPLE_REPO / ".gpuci.yml").read_text()


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server with gpuci's ACL for two hosts (the placeholders as the passwords)."""
    aclfile = tmp_path / "gpuci-acl.conf"
    aclfile.write_text(acl_file([H1, H2]).replace(">CHANGE-ME-", ">"))
    with private_redis_server(tmp_path / "redis", aclfile=aclfile) as server:
        yield server


def login(server: PrivateRedis, host: str) -> Redis:
    return Redis.from_url(server.url_as(f"gpuci-host-{host}", f"host-{host}-password"))


def assigned_run(bot: Redis, host: str, batch: str = "cpu") -> Run:
    """A run of the bot's, assigned to `host` under a lease (as the scheduler leaves it)."""
    run = runs.create_run(
        bot, repo="acme/sample", installation_id=301, pr=7, sha=SHA, batch=batch,
        trigger=RunTrigger.PULL_REQUEST, requested_by="maya", config_text=CONFIG,
        trust="trusted",
    )  # fmt: skip
    owner = leases.new_owner(run.run_id)
    moved = runs.transition(
        bot, run.run_id, {RunState.PENDING}, state=RunState.ASSIGNED, host=host,
        gpus=(), lease_owner=owner,
    )  # fmt: skip
    assert moved is not None
    return moved


# --- what a host's login cannot do at all ---------------------------------------------------

MARK = "/tmp/gpuci-boundary-pwned"  # what an executed payload would create


class Gadget:
    """A pickle that runs a shell command when unpickled."""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        import os

        return os.system, (f"touch {MARK}",)


ATTACKS: dict[str, Callable[[Redis], object]] = {
    "enqueue os.system for the events worker": lambda h: Queue(REPORTS_QUEUE, connection=h).enqueue(
        "os.system", f"touch {MARK}"
    ),
    "enqueue on another host's old RQ queue": lambda h: Queue(
        f"gpuci-host-{H2}", connection=h
    ).enqueue("os.system", f"touch {MARK}"),
    "a pickle gadget in an RQ job's data": lambda h: h.hset(
        "rq:job:evil", "data", pickle.dumps(Gadget())
    ),
    "a forged webhook delivery in the inbox": lambda h: h.lpush(keys.inbox(), b"{}"),
    "a forged delivery on the events queue": lambda h: h.lpush("rq:queue:gpuci-events", "x"),
    "plant a run": lambda h: h.hset(keys.run("999"), mapping={"repo": "evil/repo", "sha": SHA}),
    "plant a pending run": lambda h: h.zadd(keys.pending_runs(), {"999": 0}),
    "plant a result": lambda h: h.set(keys.result("1"), json.dumps({"title": "All passed"})),
    "approve a fork PR": lambda h: h.hset(keys.approval("acme/sample", 7), "sha", SHA),
    "read another host's tickets (and tokens)": lambda h: h.lrange(keys.host_tickets(H2), 0, -1),
    "read RQ's jobs": lambda h: h.hgetall("rq:job:x"),
    "take another host's GPU": lambda h: h.set(keys.gpu_lease(H2, 0), "mine"),
    "delete another host's heartbeat": lambda h: h.delete(keys.host_alive(H2)),
    "remove another host from the registry": lambda h: h.srem(keys.hosts(), H2),
    "write through a Lua script": lambda h: h.eval(
        "return redis.call('SET', KEYS[1], 'x')", 1, keys.run("1")
    ),
    "read through a Lua script": lambda h: h.eval(
        f"return redis.call('GET', '{keys.run('1')}')", 0
    ),
    "list every key": lambda h: h.keys("*"),
    "flush everything": lambda h: h.flushall(),
    "rewrite the config": lambda h: h.config_set("dir", "/tmp"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_host_login_is_refused_everything_but_its_own_keys(
    acl_server: PrivateRedis, attack: str
) -> None:
    bot = Redis.from_url(acl_server.url)
    run = assigned_run(bot, H2)
    before = bot.hgetall(keys.run(run.run_id))

    with pytest.raises((NoPermissionError, ResponseError)) as refused:
        ATTACKS[attack](login(acl_server, H1))

    assert "permission" in str(refused.value).lower() or "can't access" in str(refused.value)
    for queue in ("gpuci-events", REPORTS_QUEUE):  # what the events process would run
        SimpleWorker([Queue(queue, connection=bot)], connection=bot).work(burst=True)
    assert not Path(MARK).exists()
    assert bot.hgetall(keys.run(run.run_id)) == before
    assert bot.zcard(keys.pending_runs()) == 0 and bot.get(keys.result("1")) is None


def test_a_host_login_does_all_a_worker_needs(acl_server: PrivateRedis) -> None:
    bot, host = Redis.from_url(acl_server.url), login(acl_server, H1)
    assert leases.acquire(bot, H1, [0, 1], "1:x", 30)  # the scheduler leases...

    assert leases.renew(host, H1, [0, 1], "1:x", 30)  # ...the host renews and releases
    assert leases.release(host, H1, [0, 1], "1:x") == 2
    assert host.sadd(keys.hosts(), H1) in (0, 1)
    bot.lpush(keys.host_tickets(H1), "t")
    assert host.blmove(keys.host_tickets(H1), keys.host_taken(H1), 1, "RIGHT", "LEFT") == b"t"
    pipe = host.pipeline()
    pipe.lpush(keys.host_outbox(H1), "m").lrem(keys.host_taken(H1), 1, "t")
    assert pipe.execute() == [1, 1]


# --- what a host says is checked before it counts -------------------------------------------


def finished(run: Run, **summary: Any) -> str:
    report = RunReport(Summary(**summary)).to_json()
    return HostMessage(Kind.FINISHED, run.run_id, run.lease_owner, result=report).to_json()


def test_forged_results_are_rejected_and_change_nothing(acl_server: PrivateRedis) -> None:
    bot, host = Redis.from_url(acl_server.url), login(acl_server, H1)
    theirs, mine = assigned_run(bot, H2), assigned_run(bot, H1, batch="1")
    forged = [
        finished(theirs, tests=412, passed=412),  # another host's run
        finished(mine, tests=3, passed=412),  # counts that cannot be
        HostMessage(
            Kind.FINISHED, mine.run_id, "1:stolen", result=RunReport(Summary()).to_json()
        ).to_json(),  # not its lease
        pickle.dumps(Gadget()).decode("latin-1"),  # not JSON at all
        json.dumps(
            {
                "kind": "finished",
                "run_id": mine.run_id,
                "lease_owner": mine.lease_owner,
                "result": {"summary": {"tests": "all"}},
            }
        ),
        HostMessage(Kind.STARTED, "99", "99:x").to_json(),  # a run that does not exist
    ]
    for message in forged:
        host.lpush(keys.host_outbox(H1), message)

    assert hostlink.drain(bot, [H1]) == len(forged)

    rejected = [json.loads(r)["why"] for r in bot.lrange(keys.host_messages_rejected(), 0, -1)]
    assert len(rejected) == len(forged) and all(w.startswith("rejected") for w in rejected)
    assert any(f"not assigned to {H1}" in w for w in rejected)
    assert any("exceeds tests" in w for w in rejected)
    assert not Path(MARK).exists()
    for run in (theirs, mine):
        now = runs.get_run(bot, run.run_id)
        assert now is not None and now.state is RunState.ASSIGNED and not now.conclusion
        assert runs.load_result(bot, run.run_id) is None
    assert Queue(REPORTS_QUEUE, connection=bot).count == 0  # nothing reaches GitHub


def test_a_message_the_bot_was_applying_when_it_stopped_is_applied_again(
    acl_server: PrivateRedis,
) -> None:
    """A bot process that lost Redis or died mid-way leaves the message it was applying on its
    own list; the next drain applies it first, then the host's next one."""
    bot, host = Redis.from_url(acl_server.url), login(acl_server, H1)
    run = assigned_run(bot, H1)
    started = HostMessage(Kind.STARTED, run.run_id, run.lease_owner).to_json()
    bot.lpush(keys.host_messages_applying(H1), started)  # taken from the outbox, not applied
    host.lpush(
        keys.host_outbox(H1), HostMessage(Kind.LEASE_LOST, run.run_id, run.lease_owner).to_json()
    )

    assert hostlink.drain(bot, [H1]) == 2

    now = runs.get_run(bot, run.run_id)
    assert now is not None and now.state is RunState.RUNNING
    assert bot.llen(keys.host_messages_applying(H1)) == 0 and bot.llen(keys.host_outbox(H1)) == 0
    assert bot.hget(keys.leases_lost(), "heartbeat") == b"1"  # the second one, applied after
    with pytest.raises(NoPermissionError):  # the list is the bot's: a host cannot plant there
        host.lpush(keys.host_messages_applying(H1), started)


def test_a_ticket_whose_batch_its_config_lacks_is_refused_not_left_running(
    acl_server: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
    bot = Redis.from_url(acl_server.url)
    run = assigned_run(bot, H1, batch="nope")
    ticket = Ticket(
        run_id=run.run_id, repo=run.repo, sha=SHA, batch="nope", config_text=CONFIG,
        gpu_indices=(), lease_owner=run.lease_owner, api_url="http://127.0.0.1:1",
        source_token="t", trust="trusted",
    )  # fmt: skip
    hostlink.dispatch(bot, H1, ticket)
    settings = host_settings(acl_server, H1)

    assert work_burst(Redis.from_url(settings.redis_url), settings) == 1
    hostlink.drain(bot, [H1])

    failed = runs.get_run(bot, run.run_id)
    assert failed is not None and failed.state is RunState.COMPLETED
    assert failed.title == "refused: the config has no batch 'nope'"
    assert bot.llen(keys.host_taken(H1)) == 0


def test_the_bot_judges_a_report_with_its_own_config(acl_server: PrivateRedis) -> None:
    """A host's report says what ran; whether that is a success is the bot's to decide."""
    bot, host = Redis.from_url(acl_server.url), login(acl_server, H1)
    mine = assigned_run(bot, H1)
    report = RunReport(Summary(tests=4, skipped=4, skip_reasons={"needs a GPU": 4})).to_json()
    report["conclusion"] = "success"  # not a field of the protocol: ignored
    message = {"kind": "finished", "run_id": mine.run_id, "lease_owner": mine.lease_owner,
               "result": report}  # fmt: skip
    host.lpush(keys.host_outbox(H1), json.dumps(message))

    assert hostlink.drain(bot, [H1]) == 1

    done = runs.get_run(bot, mine.run_id)
    assert done is not None and (done.state, done.conclusion) == (RunState.COMPLETED, "neutral")
    assert done.title == "Not validated: 0 passed, 4 skipped"
    assert Queue(REPORTS_QUEUE, connection=bot).count == 1


# --- a real run with a host's login ---------------------------------------------------------


@pytest.fixture
def acl_stack(
    acl_server: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
    monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
    with stack_on(acl_server, E2E_WORLD, tmp_path, monkeypatch) as (stack, _app):
        yield stack


def host_settings(server: PrivateRedis, host: str) -> Settings:
    url = server.url_as(f"gpuci-host-{host}", f"host-{host}-password")
    return Settings.from_env({**_env(), "REDIS_URL": url, "GPUCI_HOST": host}, dotenv=None)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_a_run_goes_through_with_only_a_hosts_login_and_its_token_is_dropped(
    acl_stack: Stack, acl_server: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.github_app import GitHubApp
    from workers.gpus import open_backend
    from workers.host import publish_host

    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("GPUCI_SANDBOX_READ_ONLY", str(gate))  # the gated test reads it
    files = {"tests/test_cpu.py": GATED_TEST.format(gate=str(gate))}
    head = {"ref": "gated", "repo": "acme/sample", "files": files}
    pr = acl_stack.control("POST", "pulls", {"repo": "acme/sample", "author": "maya", "head": head})
    acl_stack.process()
    settings = host_settings(acl_server, H1)
    host = Redis.from_url(settings.redis_url)
    publish_host(host, settings, open_backend(settings.gpu_backend), slots=4)
    app = GitHubApp.from_settings(Settings.from_env())
    tick = scheduler.tick(
        acl_stack.redis,
        lambda run: app.source_token(run.installation_id, "sample"),
        acl_stack.hub.url,
    )
    assert len(tick.dispatched) == 3
    runner = threading.Thread(target=work_burst, args=(host, settings))
    runner.start()
    try:
        # While its test waits at the gate, the ticket kept for a restart has no token left.
        deadline = time.monotonic() + 60
        while cpu_tokens(host) != [""]:
            assert time.monotonic() < deadline, f"the token stayed: {cpu_tokens(host)}"
            time.sleep(0.02)
    finally:
        (gate / "open").write_text("1")
        runner.join(timeout=120)
    acl_stack.process(REPORTS_QUEUE)
    checks = acl_stack.checks(pr["pull"]["head_sha"])
    assert checks["gpuci / batch cpu"]["conclusion"] == "success"
    assert {c["status"] for c in checks.values()} == {"completed"}


def cpu_tokens(host: Redis) -> list[str]:
    taken = [json.loads(t) for t in host.lrange(keys.host_taken(H1), 0, -1)]
    return [t["source_token"] for t in taken if t["batch"] == "cpu"]


GATED_TEST = """
import time
from pathlib import Path


def test_waits_for_the_gate():
    gate = Path({gate!r})
    deadline = time.monotonic() + 60
    while not (gate / "open").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
"""


SHA_A, SHA_B = "a" * 40, "b" * 40
APPROVED = Ticket(
    run_id="7", repo="acme/sample", sha=SHA_A, batch="2", config_text="", gpu_indices=(0,),
    lease_owner="7:x", api_url="http://hub", source_token="t", trust="approved", pr=3,
    approver="maya",
)  # fmt: skip
OPEN_AT_A = {"state": "open", "head": {"sha": SHA_A}}


@pytest.mark.parametrize(
    ("pull", "permission", "refusal"),
    [
        (OPEN_AT_A, {"permission": "write", "role_name": "write"}, None),
        (OPEN_AT_A, {"permission": "admin", "role_name": "maintain"}, None),
        ({"state": "open", "head": {"sha": SHA_B}}, {"permission": "write"}, "head is now bbbb"),
        ({"state": "closed", "head": {"sha": SHA_A}}, {"permission": "write"}, "PR is closed"),
        (OPEN_AT_A, {"permission": "read", "role_name": "triage"}, "maya, who approved"),
        (OPEN_AT_A, {"permission": "none"}, "no longer has write access"),
        ({"state": "open", "head": "aaaa"}, {"permission": "write"}, "head is now None"),
        (
            {"state": "open", "head": {"sha": SHA_A, "repo": None}},
            {"permission": "write"},
            "head repository was deleted",
        ),
        (["not", "an", "object"], {"permission": "write"}, "not an object"),
    ],
)
def test_github_decides_whether_approved_code_starts(
    pull: Any, permission: Any, refusal: str | None
) -> None:
    found = github_refusal(APPROVED, pull, permission)

    if refusal is None:
        assert found is None
    else:
        assert found is not None and refusal in found and found.startswith("refused: ")
