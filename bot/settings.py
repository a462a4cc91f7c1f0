"""One typed Settings object, loaded once from the environment (and a `.env` file)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields
from pathlib import Path


class SettingsError(ValueError):
    """A setting is present but unusable; the message names the variable and what it expects."""


@dataclass(frozen=True)
class Settings:
    # Redis for everything: queues, leases, runs, approvals.
    redis_url: str = "redis://127.0.0.1:6379/0"
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
    # Parent directory of the fresh per-run working directories.
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
    # Log lines of the processes: "text" (key=value pairs) or "json" (one object a line).
    log_format: str = "text"
    # Largest accepted webhook body, bytes (GitHub caps payloads at 25 MB).
    max_body_bytes: int = 25 * 1024 * 1024

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
            values[field.name] = _convert(name, env[name], field.default)
        settings = cls(**values)  # type: ignore[arg-type]
        if not settings.host:
            settings = _replace(settings, host=socket.gethostname())
        if not settings.work_dir:
            cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            settings = _replace(settings, work_dir=str(cache / "gpuci" / "runs"))
        return settings


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
    """KEY=VALUE lines; blank lines and # comments ignored; surrounding quotes removed."""
    if not path.is_file():
        return []
    pairs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        pairs.append((key.strip().removeprefix("export ").strip(), value))
    return pairs
