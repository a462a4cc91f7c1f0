"""`.gpuci.yml`: the schema, loading with located errors, and checks against host inventories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DEFAULT_APPROVAL_LABEL = "gpuci/approved"
DEFAULT_PYTEST_ARGS: tuple[str, ...] = ("-ra", "--tb=short")


@dataclass(frozen=True)
class ConfigIssue:
    """One problem, located: `file:line: key.path: message`."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(Exception):
    """The file is not a valid config; `issues` holds every problem found, not just the first."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


@dataclass(frozen=True)
class Batch:
    name: str
    gpus: int
    tests: tuple[str, ...]
    timeout_s: int = 3600
    markers: str | None = None
    pytest_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # None: no -n; an int: `-n N`; "auto": from free VRAM / vram_per_worker_mb.
    workers: int | Literal["auto"] | None = None
    vram_per_worker_mb: int | None = None
    gpu_model: str | None = None
    min_memory_mb: int | None = None
    min_compute_capability: tuple[int, int] | None = None
    allow_no_tests: bool = False


@dataclass(frozen=True)
class Layer:
    name: str
    batches: tuple[str, ...]
    trigger: str | None = None  # "pull_request" for automatic PR runs
    schedule: str | None = None  # cron expression, runs against the default branch


@dataclass(frozen=True)
class Config:
    version: int
    batches: dict[str, Batch]
    layers: dict[str, Layer] = field(default_factory=dict)
    approval_label: str = DEFAULT_APPROVAL_LABEL
    setup: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS
    env: dict[str, str] = field(default_factory=dict)
