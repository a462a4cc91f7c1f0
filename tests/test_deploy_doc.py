"""docs/deploy.md as a new operator copies it: every env-file block, pasted as printed into a
scratch prefix, loads the same under systemd's EnvironmentFile= rules (systemd.exec(5),
implemented here) and under gpuci's own `.env` reader, and gpuci accepts the settings; the
processes started with those blocks say what they should; the other deploy docs hold too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from redis import Redis

from contract.settings import Settings, SettingsError
from tests.conftest import EVENTS_WORLD, Stack, serve_stack
from tests.test_deploy_files import ROOT

DOCS = ROOT / "docs"
DEPLOY = DOCS / "deploy.md"
ENV_DOCS = [DEPLOY, DOCS / "github-app.md", DOCS / "fakehub.md"]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_ASSIGNMENT = re.compile(r"[A-Z][A-Z0-9_]*=")


# --- systemd's EnvironmentFile= parser, as systemd.exec(5) describes it ------------------------

WHITESPACE, NEWLINE, COMMENTS = " \t\r", "\n\r", "#;"


def systemd_env(text: str) -> dict[str, str]:
    """Assignments as systemd reads an EnvironmentFile=: lines starting with # or ; (after
    whitespace) and lines without "=" ignored; an unquoted value keeps its interior whitespace
    and quotes, loses leading and trailing whitespace, and takes a backslash as an escape (a
    backslash-newline continues the line); a value starting with ' or " is quoted as in the
    shell and may span lines. A comment after a value is part of the value."""
    env: dict[str, str] = {}
    state, key, value = "pre_key", "", ""
    for char in text + "\n":
        if state == "pre_key":
            if char in COMMENTS:
                state = "comment"
            elif char not in WHITESPACE + NEWLINE:
                state, key = "key", char
        elif state == "comment":
            state = "comment_escape" if char == "\\" else "pre_key" if char in NEWLINE else state
        elif state == "comment_escape":
            state = "comment"
        elif state == "key":
            if char in NEWLINE:
                state = "pre_key"  # no "=": ignored
            elif char == "=":
                state, key, value = "pre_value", key.rstrip(WHITESPACE), ""
            else:
                key += char
        elif state == "pre_value":
            if char in NEWLINE:
                env[key], state = value, "pre_key"
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "\\":
                state = "escape"
            elif char not in WHITESPACE:
                state, value = "value", value + char
        elif state == "value":
            if char in NEWLINE:
                env[key], state = value.rstrip(WHITESPACE), "pre_key"
            elif char == "\\":
                state = "escape"
            else:
                value += char
        elif state == "escape":
            state, value = "value", value + ("" if char == "\n" else char)
        elif state == "single":
            state, value = ("pre_value", value) if char == "'" else (state, value + char)
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            if char in '"\\`$':
                value += char
            elif char != "\n":
                value += "\\" + char
    return env


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1\n# comment\n; also\n\nB = two words  \n", {"A": "1", "B": "two words"}),
        ("A=nvml         # the default\n", {"A": "nvml         # the default"}),
        ("A=   # a comment pasted\n", {"A": "# a comment pasted"}),
        ('A=\'x # y\'\nB="q\\"uote"\nC=a\\\nb\n', {"A": "x # y", "B": 'q"uote', "C": "ab"}),
        ("A=it's\nno equals sign\nB=\n", {"A": "it's", "B": ""}),
    ],
)
def test_the_systemd_parser_follows_systemd_exec(text: str, expected: dict[str, str]) -> None:
    assert systemd_env(text) == expected


# --- the blocks of the docs ---------------------------------------------------------------------


def env_blocks(doc: Path) -> list[str]:
    """Fenced blocks that are env files: only comments, blank lines and NAME=value lines."""
    found = []
    for block in _FENCE.findall(doc.read_text()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        assignments = [line for line in lines if not line.startswith("#")]
        if assignments and all(_ASSIGNMENT.match(line) for line in assignments):
            found.append(block)
    return found


def gpuci_env(block: str, prefix: Path) -> dict[str, str]:
    """The block pasted into a file of the scratch prefix and read by gpuci's .env reader."""
    from contract.settings import _read_dotenv

    path = prefix / "etc" / "gpuci" / "gpuci.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block)
    return dict(_read_dotenv(path))


def test_deploy_md_prints_the_bot_and_gpu_host_env_files() -> None:
    blocks = env_blocks(DEPLOY)
    urls = [systemd_env(b).get("REDIS_URL", "") for b in blocks]
    assert any("gpuci-bot:" in url for url in urls), urls
    assert any("gpuci-host-" in url for url in urls), urls


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=f"{doc.name}-{n}")
        for doc in ENV_DOCS
        for n, b in enumerate(env_blocks(doc))
    ],
)
def test_an_env_block_pasted_as_printed_works_under_systemd_and_gpuci(
    block: str, tmp_path: Path
) -> None:
    by_systemd = systemd_env(block)
    by_gpuci = gpuci_env(block, tmp_path)
    assert by_systemd == by_gpuci
    for name, value in by_systemd.items():
        assert not re.search(r"(^|\s)#", value), f"{name}={value!r}: a comment became the value"
    settings = Settings.from_env({}, dotenv=str(tmp_path / "etc" / "gpuci" / "gpuci.env"))
    for name, value in by_systemd.items():  # each text setting holds exactly what was printed
        field = "redis_url" if name == "REDIS_URL" else name.removeprefix("GPUCI_").lower()
        if value and isinstance(getattr(settings, field, None), str):
            assert getattr(settings, field) == value, name


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (
            "GPUCI_PUBLIC_REPOS=                         # repositories anyone may see",
            "GPUCI_PUBLIC_REPOS",
        ),
        (
            "GPUCI_GPU_BACKEND=nvml         # the default; sim:... only for tests",
            "GPUCI_GPU_BACKEND",
        ),
        ("GPUCI_WEBHOOK_SECRET=s3cret # the App's webhook secret", "GPUCI_WEBHOOK_SECRET"),
    ],
)
def test_a_comment_pasted_after_a_value_is_refused_naming_the_variable(
    line: str, name: str, tmp_path: Path
) -> None:
    value = systemd_env(line)[name]
    assert "#" in value  # systemd keeps it in the value...
    with pytest.raises(SettingsError, match=f"^{name}=.*comment on a line of its own") as refused:
        Settings.from_env({name: value}, dotenv=None)  # ...and gpuci refuses it, from either
    assert "s3cret" not in str(refused.value)  # a secret's value is never shown
    gpuci_env(line, tmp_path)
    with pytest.raises(SettingsError, match=f"^{name}="):
        Settings.from_env({}, dotenv=str(tmp_path / "etc" / "gpuci" / "gpuci.env"))


# --- the processes, started with the blocks as systemd would give them -------------------------


def block_with(name: str, fragment: str) -> dict[str, str]:
    for block in env_blocks(DEPLOY):
        env = systemd_env(block)
        if fragment in env.get(name, ""):
            return env
    raise AssertionError(f"no env block in deploy.md sets {name} to ...{fragment}...")


def gpuci(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`gpuci ARGS` with exactly the unit's environment (plus PATH), in an empty directory."""
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), **env}
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        env=environ, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_gpu_host_block_asks_for_real_gpus_and_points_at_the_driver(tmp_path: Path) -> None:
    env = block_with("REDIS_URL", "gpuci-host-")
    assert env["GPUCI_GPU_BACKEND"] == "nvml"
    shown = gpuci(["gpus"], env, tmp_path)
    if shown.returncode == 0:
        pytest.skip("this machine has working NVML")
    assert shown.returncode == 2, shown.stderr
    assert "unknown GPU backend" not in shown.stderr
    assert "nvidia-smi" in shown.stderr


def test_the_bot_block_reaches_redis_and_never_prints_the_password(tmp_path: Path) -> None:
    env = block_with("REDIS_URL", "gpuci-bot:")
    env["REDIS_URL"] = env["REDIS_URL"].replace("PASSWORD", "not-the-password")
    shown = gpuci(["runs"], env, tmp_path)
    assert shown.returncode == 2
    assert "not-the-password" not in shown.stdout + shown.stderr
    # 127.0.0.1:6379 (the tests' Redis) has no gpuci-bot user: a refused login, said so
    assert "login refused" in shown.stderr or "unreachable" in shown.stderr, shown.stderr


def test_the_one_machine_drop_in_replaces_the_workers_env_file(tmp_path: Path) -> None:
    """The printf of "One machine for both", run into the scratch prefix, writes a drop-in
    that clears the unit's EnvironmentFile= list and names worker.env alone."""
    text = DEPLOY.read_text()
    found = re.search(r"^printf (.*?) \\\n\s+> (/etc/systemd/\S+)$", text, re.M)
    assert found, "deploy.md has no drop-in printf"
    target = tmp_path / found.group(2).lstrip("/")
    target.parent.mkdir(parents=True)
    subprocess.run(["bash", "-c", f"printf {found.group(1)} > {target}"], check=True)
    lines = target.read_text().splitlines()
    assert lines == ["[Service]", "EnvironmentFile=", "EnvironmentFile=/etc/gpuci/worker.env"]


def test_web_logs_in_the_configured_format(tmp_path: Path) -> None:
    """GPUCI_LOG_FORMAT reaches the web process too, as gunicorn starts it (app:create_app())."""
    script = (
        "import logging; from app import create_app; create_app(); "
        "logging.getLogger('gpuci.web').warning('hello run=7')"
    )
    env = {"GPUCI_LOG_FORMAT": "json", "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stderr.strip().splitlines()[-1])
    assert entry["message"] == "hello run=7" and entry["run"] == "7" and entry["level"] == "WARNING"


def test_redeliver_help_says_what_it_is_for() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "redeliver", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0
    assert "redeliver" in done.stdout and "The scheduler does this every minute" in done.stdout
    assert "gpuci redeliver" in DEPLOY.read_text()


def test_every_gpuci_command_is_in_the_operators_docs() -> None:
    from tests.test_deploy_files import subcommands

    documented = DEPLOY.read_text() + (DOCS / "github-app.md").read_text()
    documented += (ROOT / "README.md").read_text()
    documented += (DOCS / "config.md").read_text() + (DOCS / "fakehub.md").read_text()
    missing = [c for c in sorted(subcommands()) if f"gpuci {c}" not in documented]
    assert not missing, missing


# --- the manifest's permissions are enough -------------------------------------------------


@pytest.fixture
def manifest_stack(
    redis_conn: Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    """The events world, its App holding exactly the permissions app-manifest.json asks for."""
    world = yaml.safe_load(EVENTS_WORLD.read_text())
    world["app"]["permissions"] = json.loads((ROOT / "app-manifest.json").read_text())[
        "default_permissions"
    ]
    path = tmp_path / "world.yml"
    path.write_text(yaml.safe_dump(world))
    with serve_stack(path, redis_conn, redis_url, tmp_path, monkeypatch) as found:
        yield found


def test_the_manifests_permissions_cover_replies_reactions_and_labels(
    manifest_stack: Stack,
) -> None:
    """Issues is only read: GitHub (and fakehub) take Pull requests write for the issue
    endpoints on a PR, the only place gpuci writes."""
    from tests.test_events import LABEL, fork_pr, label, labels
    from tests.test_events_commands import comment, reactions, replies

    pr = fork_pr(manifest_stack)
    label(manifest_stack, pr["number"], "tracy", add=LABEL)  # triage: refused and removed
    manifest_stack.process()
    assert labels(manifest_stack, pr["number"]) == []
    sent = comment(manifest_stack, pr["number"], "alice", "/gpuci help")
    assert reactions(manifest_stack, sent["id"]) == ["gpuci[bot]:eyes"]
    found = replies(manifest_stack, pr["number"])
    assert any("@tracy" in body for body in found) and any("/gpuci run" in b for b in found)


def test_the_units_state_directories_are_the_ones_the_docs_create() -> None:
    """The bot units work in /var/lib/gpuci-bot (the gpuci account's home, created in section
    2), the worker in /var/lib/gpuci: one machine can run both without systemd handing one
    unit's directory to the other's user."""
    from tests.test_deploy_files import unit

    text = DEPLOY.read_text()
    for name in ("web", "events", "scheduler", "worker"):
        service = unit(ROOT / "deploy" / "systemd" / f"gpuci-{name}.service")["Service"]
        state = "gpuci" if name == "worker" else "gpuci-bot"
        assert service["StateDirectory"] == state, name
        assert service["WorkingDirectory"] == f"/var/lib/{state}", name
    assert "useradd --system --home-dir /var/lib/gpuci-bot " in text
    assert "install -d -o gpuci -g gpuci -m 0750 /var/lib/gpuci-bot" in text
    # the key is installed for the gpuci group after the account exists, as github-app.md says
    assert text.index("useradd --system") < text.index("install -o root -g gpuci -m 0640 app.pem")
    assert "`0640`" in (DOCS / "github-app.md").read_text()
