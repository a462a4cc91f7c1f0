"""The deployment files say what the code does: the App manifest asks for the least permissions,
the systemd units start real `gpuci` commands, and the deploy docs name real settings and files."""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
from dataclasses import fields
from pathlib import Path

import pytest

from bot.cli import build_parser
from contract.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "app-manifest.json"
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
DOCS = [ROOT / "docs" / "deploy.md", ROOT / "docs" / "security.md"]

LEAST_PERMISSIONS = {
    "checks": "write",
    "contents": "read",
    "pull_requests": "write",
    "issues": "read",
    "metadata": "read",
}
EVENTS = {"pull_request", "issue_comment", "check_run", "check_suite"}
# The web unit serves the Procfile's WSGI app with gunicorn rather than `gpuci web` (Flask's
# development server); every other unit starts a `gpuci` subcommand.
GUNICORN_APP = "app:create_app()"


def subcommands() -> set[str]:
    parser = build_parser()
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def setting_names() -> set[str]:
    return {
        "REDIS_URL" if f.name == "redis_url" else "GPUCI_" + f.name.upper()
        for f in fields(Settings)
    }


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_manifest_asks_for_exactly_the_least_permissions_and_four_events() -> None:
    manifest = json.loads(MANIFEST.read_text())
    assert manifest["default_permissions"] == LEAST_PERMISSIONS
    assert set(manifest["default_events"]) == EVENTS
    assert len(manifest["default_events"]) == len(EVENTS)


def test_manifest_has_the_fields_of_githubs_manifest_flow() -> None:
    manifest = json.loads(MANIFEST.read_text())
    for key in ("name", "url", "hook_attributes", "redirect_url", "public"):
        assert key in manifest, key
    assert manifest["hook_attributes"]["url"].endswith("/webhook")
    assert manifest["hook_attributes"].get("active", True) is True
    assert manifest["public"] is False


def test_there_is_a_unit_per_process() -> None:
    names = {path.name for path in UNITS}
    expected = {f"gpuci-{p}.service" for p in ("web", "events", "scheduler", "worker")}
    assert expected <= names


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_starts_a_real_gpuci_command(path: Path) -> None:
    service = unit(path)["Service"]
    argv = shlex.split(service["ExecStart"])
    program = Path(argv[0]).name
    if program == "gunicorn":
        assert argv[-1] == GUNICORN_APP
        return
    assert program == "gpuci", argv
    assert argv[1] in subcommands(), argv
    parsed = build_parser().parse_args(argv[1:])  # the options exist too
    assert hasattr(parsed, "handler")


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_reads_settings_restarts_and_kills_its_whole_cgroup(path: Path) -> None:
    service = unit(path)["Service"]
    assert service["EnvironmentFile"] == "/etc/gpuci/gpuci.env"
    assert service["Restart"] == "on-failure"
    assert service["KillMode"] == "control-group"
    assert service.get("User"), "each unit names its user"


def gunicorn_options(argv: list[str]) -> dict[str, str]:
    """`--name value` pairs of a gunicorn command line (flags without a value map to "")."""
    options, rest = {}, argv[1:-1]
    while rest:
        name = rest.pop(0)
        options[name] = rest.pop(0) if rest and not rest[0].startswith("--") else ""
    return options


def test_the_web_unit_serves_as_the_procfile_does_with_gpucis_worker() -> None:
    from gunicorn.util import load_class
    from gunicorn.workers.base import Worker

    (line,) = [ln for ln in (ROOT / "Procfile").read_text().splitlines() if ln.startswith("web:")]
    procfile = shlex.split(line.removeprefix("web:").replace("${PORT:-8000}", "8000"))
    service = shlex.split(
        unit(ROOT / "deploy" / "systemd" / "gpuci-web.service")["Service"]["ExecStart"]
    )
    assert Path(procfile[0]).name == Path(service[0]).name == "gunicorn"
    assert procfile[-1] == service[-1] == GUNICORN_APP
    ours, theirs = gunicorn_options(procfile), gunicorn_options(service)
    theirs.pop("--access-logfile")  # the unit logs requests to the journal
    assert ours == theirs
    assert ours["--worker-class"] == "bot.server.Worker"
    assert issubclass(load_class(ours["--worker-class"]), Worker)


def test_worker_waits_out_the_host_heartbeat_before_restarting() -> None:
    from workers.host import HOST_TTL_S

    service = unit(ROOT / "deploy" / "systemd" / "gpuci-worker.service")["Service"]
    assert float(service["RestartSec"]) > HOST_TTL_S


def test_every_variable_in_the_deploy_docs_is_a_setting() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    mentioned = set(re.findall(r"\b(?:GPUCI_[A-Z0-9_]*[A-Z0-9]|REDIS_URL)\b", text))
    assert mentioned, "docs/deploy.md names the settings it uses"
    assert mentioned - {"GPUCI_RUN_TOKEN"} <= setting_names()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_point_at_files_that_exist(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{doc.name} links to {target}, which does not exist"


def test_redis_acl_file_has_only_user_lines() -> None:
    """Redis refuses an ACL file with comments; the explanation lives in docs/deploy.md."""
    lines = [ln for ln in (ROOT / "deploy" / "redis-acl.conf").read_text().splitlines() if ln]
    assert lines and all(line.startswith("user ") for line in lines)


def test_the_shipped_acl_file_is_what_gpuci_redis_acl_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bot.cli import main

    assert main(["redis-acl", "h20-01", "h20-02"]) == 0
    assert capsys.readouterr().out == (ROOT / "deploy" / "redis-acl.conf").read_text()


def test_tests_named_in_the_security_doc_exist() -> None:
    """docs/security.md names the test covering each threat: each name must be a real test."""
    text = (ROOT / "docs" / "security.md").read_text()
    named = set(re.findall(r"\b(test_\w+)\b(?!\.py)", text)) - {"test_environment"}
    assert named
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    missing = sorted(n for n in named if not re.search(rf"def {n}\(", sources))
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
