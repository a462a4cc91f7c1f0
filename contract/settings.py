"""One typed Settings object, loaded once from the environment (and a `.env` file)."""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from dataclasses import dataclass, fields
from pathlib import Path

from contract.config import parse_duration, parse_size
from contract.redact import redact_text, redact_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # what an unset REDIS_URL means


class SettingsError(ValueError):
    """A setting is present but unusable; the message names the variable and what it expects."""


@dataclass(frozen=True)
class Settings:
    # Redis for everything: queues, leases, runs, approvals.
    redis_url: str = DEFAULT_REDIS_URL
    # The GitHub App's webhook secret; `gpuci web` refuses to start without it.
    webhook_secret: str = ""
    # GitHub App id and the path of its PEM private key (events and scheduler processes only).
    app_id: str = ""
    private_key_path: str = ""
    # REST base URL: https://api.github.com, a GitHub Enterprise Server, or fakehub.
    github_api_url: str = "https://api.github.com"
    # Seconds between two writes to GitHub (GitHub asks integrations for about 1 s; 0 in tests).
    github_write_interval_s: float = 1.0
    # `nvml` (real GPUs) or `sim:<spec>` (simulated: `sim:8xH20-96GB` or `sim:/path/gpus.json`).
    gpu_backend: str = "nvml"
    # This GPU host's name in Redis and in Check Runs.
    host: str = ""
    # Where the dashboard is reachable, for Check Runs' details_url.
    public_url: str = "http://127.0.0.1:8000"
    # Dashboard access token: when set, dashboard pages and JUnit downloads need it (`?token=`
    # once, then a cookie; or `Authorization: Bearer`). /webhook, /healthz, /metrics stay open.
    dashboard_token: str = ""
    # Comma-separated repositories (fnmatch patterns, e.g. `acme/*`) whose results the
    # dashboard shows without a token. gpuci does not know a repository's visibility, so every
    # other repository counts as private: its titles, summaries, logs and JUnit XML are shown
    # only with a token configured and presented.
    public_repos: str = ""
    # Repositories (same patterns) that are private even when GPUCI_PUBLIC_REPOS matches them.
    private_repos: str = ""
    # Parent directory of the fresh per-run working directories; empty:
    # $XDG_CACHE_HOME/gpuci/runs (~/.cache/gpuci/runs without XDG_CACHE_HOME).
    work_dir: str = ""
    # A GPU counts as idle only with at most this much memory used (MiB)...
    idle_memory_mb: int = 256
    # ...and zero utilization over this many NVML samples, taken this many seconds apart.
    idle_samples: int = 3
    idle_sample_interval_s: float = 0.2
    # GPU lease time-to-live; a heartbeat renews it every third of it.
    lease_ttl_s: int = 30
    # Seconds between SIGTERM and SIGKILL when a batch times out or is cancelled.
    kill_grace_s: float = 10.0
    # A run's output log is capped at this many bytes (head and tail kept).
    log_max_bytes: int = 5 * 1024 * 1024
    # Run test processes as this unprivileged user (empty: as the worker's own user).
    run_as: str = ""
    # The sandbox of every run: `auto` (bubblewrap, and the worker refuses to start without
    # it), `bwrap`, or `none` (tests run unsandboxed: a warning at start; never for fork code).
    sandbox: str = "auto"
    # Extra host paths runs may read, comma-separated (datasets, toolkits, a local wheelhouse).
    sandbox_read_only: str = ""
    # Host paths runs must not see although they are under /etc or /usr, comma-separated
    # (/etc/gpuci is always hidden).
    sandbox_hide: str = ""
    # This host's runtimes file: its base environments and container engine (docs/deploy.md).
    # Empty: the only base is `default`, the worker's own Python.
    runtimes_file: str = ""
    # uv for installs in runs' environments: a path, empty to find it (beside the worker's
    # Python, then on PATH), or `none` to use pip.
    uv: str = ""
    # Where runtimes' caches persist (per repository and runtime); empty: beside work_dir.
    cache_dir: str = ""
    # Size limit of each cache a runtime does not size itself (least recently used go first).
    cache_max_size: str = "20GiB"
    # Size limit of the cache of source archives.
    archive_cache_max_size: str = "10GiB"
    # How long a failed run's directory is kept for debugging (0: removed at once, as a
    # successful run's is).
    keep_failed_runs: str = "24h"
    # Below this much free space where runs' directories are, the host takes no new runs.
    min_free_disk: str = "10GiB"
    # Log lines of the processes: "text" (key=value pairs) or "json" (one object a line).
    log_format: str = "text"
    # Largest accepted webhook body, bytes (GitHub caps payloads at 25 MB).
    max_body_bytes: int = 25 * 1024 * 1024
    # Tests only: every run on this host raises at this step of its run path (FAULT_STEPS),
    # to show that a crash ends the run. Never set in production.
    test_fault: str = ""
    # Test history (bot/history.py): runs kept per batch on the default branch, and per PR...
    history_default_runs: int = 200
    history_pr_runs: int = 20
    # ...a failed test is flaky if it flipped between pass and fail this many times (N) in
    # the default branch's last runs of its batch (K)...
    history_flaky_flips: int = 3
    history_flaky_window: int = 20
    # ...and an XPASS says "remove the xfail marker" once it passed this many baseline runs.
    history_xpass_runs: int = 3

    @classmethod
    def from_env(
        cls, environ: dict[str, str] | None = None, dotenv: str | None = ".env"
    ) -> Settings:
        """Read GPUCI_* variables (and REDIS_URL); values from `dotenv` fill what is unset."""
        env = dict(_read_dotenv(Path(dotenv))) if dotenv else {}
        env.update(os.environ if environ is None else environ)
        values: dict[str, object] = {}
        for field in fields(cls):
            name = _env_name(field.name)
            if name not in env or env[name] == "":
                continue
            _refuse_pasted_comment(name, env[name])
            values[field.name] = _convert(name, env[name], field.default)
        settings = cls(**values)  # type: ignore[arg-type]
        _check_units(settings)
        if not settings.host:
            settings = _replace(settings, host=socket.gethostname())
        if not settings.work_dir:
            cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            settings = _replace(settings, work_dir=str(cache / "gpuci" / "runs"))
        if not settings.cache_dir:
            settings = _replace(settings, cache_dir=str(Path(settings.work_dir).parent / "caches"))
        return settings

    def bytes_of(self, name: str) -> int:
        """A size setting in bytes (`cache_max_size`, `min_free_disk`, ...)."""
        return parse_size(getattr(self, name)) * 1024 * 1024

    def seconds_of(self, name: str) -> int:
        """A duration setting in seconds; `0` is 0."""
        value = getattr(self, name).strip()
        return 0 if value == "0" else parse_duration(value)

    def paths_of(self, name: str) -> tuple[str, ...]:
        """A comma-separated list of paths."""
        return tuple(p.strip() for p in getattr(self, name).split(",") if p.strip())


# The steps of a GPU host's run path where GPUCI_TEST_FAULT can make it raise, in order.
FAULT_STEPS = ("sources", "setup", "preflight", "pytest", "results", "store")
_SIZES = ("cache_max_size", "archive_cache_max_size", "min_free_disk")
_DURATIONS = ("keep_failed_runs",)


def _check_units(settings: Settings) -> None:
    """Sizes and durations are read here, so that a typo stops the process at start."""
    for name in _SIZES:
        try:
            parse_size(getattr(settings, name))
        except ValueError as exc:
            raise SettingsError(f"{_env_name(name)}: {exc}") from None
    _check_redis_url(settings.redis_url)
    if settings.test_fault and settings.test_fault not in FAULT_STEPS:
        steps = ", ".join(FAULT_STEPS)
        raise SettingsError(f"GPUCI_TEST_FAULT={settings.test_fault!r} is not one of {steps}")
    for name in _DURATIONS:
        value = getattr(settings, name)
        try:
            if value.strip() != "0":
                parse_duration(value)
        except ValueError as exc:
            raise SettingsError(f"{_env_name(name)}: {exc}") from None


# A `#` at the start of a value or after whitespace: a comment pasted after the value, which
# neither systemd's EnvironmentFile= nor the .env reader strips (both keep it in the value).
_PASTED_COMMENT = re.compile(r"(^|\s)#")
_SECRETS = ("GPUCI_WEBHOOK_SECRET", "GPUCI_DASHBOARD_TOKEN")


def _refuse_pasted_comment(name: str, value: str) -> None:
    if _PASTED_COMMENT.search(value):
        shown = repr(redact_text(value if len(value) <= 60 else value[:57] + "..."))
        if name in _SECRETS:
            shown = "(the value is not shown)"
        raise SettingsError(
            f"{name}={shown} looks like a value with a comment after it: put the comment on "
            "a line of its own (systemd's EnvironmentFile= and .env files keep everything after "
            "'=' in the value)"
        )


def _check_redis_url(url: str) -> None:
    """A REDIS_URL redis-py would choke on (with a traceback) is refused, its password hidden."""
    parts = urllib.parse.urlsplit(url)
    problem = ""
    if parts.scheme not in ("redis", "rediss", "unix"):
        problem = "it must start with redis://, rediss:// or unix://"
    elif parts.scheme != "unix" and not re.fullmatch(r"/?[0-9]*", parts.path):
        problem = f"its database {parts.path.lstrip('/')!r} is not a number"
    else:
        try:
            parts.port  # noqa: B018  (parsing it is the check)
        except ValueError:
            problem = "its port is not a number"
    if problem:
        example = "redis://USER:PASSWORD@HOST:6379/0"
        raise SettingsError(f"REDIS_URL={redact_url(url)!r}: {problem} (e.g. {example})")


def _env_name(field_name: str) -> str:
    return "REDIS_URL" if field_name == "redis_url" else "GPUCI_" + field_name.upper()


def _convert(name: str, raw: str, default: object) -> object:
    try:
        if isinstance(default, bool):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        kind = type(default).__name__
        raise SettingsError(f"{name}={raw!r} is not a valid {kind}") from None
    return raw


def _replace(settings: Settings, **changes: object) -> Settings:
    from dataclasses import replace

    return replace(settings, **changes)  # type: ignore[arg-type]


def _read_dotenv(path: Path) -> list[tuple[str, str]]:
    """KEY=VALUE lines; blank lines and comments (lines starting with # or ;, as systemd's
    EnvironmentFile= reads them) ignored; quotes around a whole value removed."""
    if not path.is_file():
        return []
    pairs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        pairs.append((key.strip().removeprefix("export ").strip(), value))
    return pairs
