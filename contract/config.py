"""`.gpuci.yml`: the schema, loading with located errors, and checks against host inventories."""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

DEFAULT_APPROVAL_LABEL = "gpuci/approved"
DEFAULT_RUNTIME = "default"  # the profile of `runtime: {setup: [...]}`, or of no runtime key
DEFAULT_BASE = "default"  # the host's default base environment
NETWORKS = ("host", "none")
EXPECT_KEYS = ("python", "torch", "cuda")
# Caches a runtime may declare: persisted per repository and runtime between runs.
CACHE_NAMES = ("packages", "huggingface", "torch-hub", "torch-extensions", "triton")
DEFAULT_PYTEST_ARGS: tuple[str, ...] = ("-ra", "--tb=short")
DEFAULT_TIMEOUT_S = 3600
MAX_CONFIG_BYTES = 1024 * 1024
MAX_GPUS = 64
MAX_LABEL_CHARS = 50  # GitHub's limit on a label name


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
    """The file is not a valid config; `issues` holds every problem found, not just the first.

    `batches` holds each batch whose `gpus` and GPU constraints were still read validly (only
    those fields), so that it can be checked against hosts anyway; `lines` as `Config.lines`.
    """

    def __init__(
        self,
        issues: list[ConfigIssue],
        batches: Mapping[str, Batch] | None = None,
        lines: Mapping[str, int] | None = None,
    ):
        self.issues = issues
        self.batches = dict(batches or {})
        self.lines = dict(lines or {})
        super().__init__("\n".join(str(i) for i in issues))


@dataclass(frozen=True)
class Batch:
    name: str
    gpus: int
    tests: tuple[str, ...]  # empty: pytest's own default paths
    timeout_s: int = DEFAULT_TIMEOUT_S
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
    runtime: str | None = None  # a profile of `runtimes`; None: the config's default runtime
    network: str | None = None  # "host" or "none"; None: the runtime's


@dataclass(frozen=True)
class Runtime:
    """How a batch's environment is made: a fresh virtual environment layered on a base the
    GPU host provides (`base`, None for the host's default base), or a container `image`."""

    name: str
    base: str | None = None
    image: str | None = None
    setup: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)  # python / torch / cuda -> version
    caches: dict[str, int | None] = field(default_factory=dict)  # name -> MiB (None: host's)
    network: str = "host"  # "host": the host's network; "none": no network at all

    @property
    def requirement(self) -> str:
        """What a host must provide for it: `base:<name>` or `image` (a container engine)."""
        return "image" if self.image else f"base:{self.base or DEFAULT_BASE}"

    def describe(self) -> str:
        """`torch (base torch2.13-cu13.0)`, `trl (image pytorch/pytorch:2.13)`."""
        where = f"image {self.image}" if self.image else f"base {self.base or DEFAULT_BASE}"
        return f"{self.name} ({where})"


_PLAIN = Runtime(DEFAULT_RUNTIME)  # the host's default base, no setup


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
    runtimes: dict[str, Runtime] = field(default_factory=lambda: {DEFAULT_RUNTIME: _PLAIN})
    default_runtime: str = DEFAULT_RUNTIME
    pytest_args: tuple[str, ...] = DEFAULT_PYTEST_ARGS
    env: dict[str, str] = field(default_factory=dict)
    conclusion: str = "strict"  # or "new_failures": only failures new against history fail
    # Key path ("batches.10", "batches.10.timeout") -> 1-based line of that key in the file.
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def auto_batches(self) -> tuple[str, ...]:
        """The batches that run automatically for trusted PRs: every `pull_request` layer's."""
        names = {b for layer in self.layers.values() if layer.trigger == "pull_request"
                 for b in layer.batches}  # fmt: skip
        return tuple(natural_sort(names))

    def runtime_for(self, batch: Batch) -> Runtime:
        """The batch's runtime profile, its `network` applied."""
        runtime = self.runtimes[batch.runtime or self.default_runtime]
        if batch.network and batch.network != runtime.network:
            runtime = replace(runtime, network=batch.network)
        return runtime

    @property
    def setup(self) -> tuple[str, ...]:
        """The default runtime's setup commands."""
        return self.runtimes[self.default_runtime].setup


@dataclass(frozen=True)
class HostGpu:
    """One GPU of a host inventory, as far as batch constraints care."""

    name: str
    memory_mb: int
    compute_capability: tuple[int, int]


# --- durations, sizes, names ---------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?)", re.IGNORECASE)
_BYTES_PER_UNIT = {
    "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4,
}  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIB = 1024 * 1024


def parse_duration(text: str | int) -> int:
    """Seconds in `90s`, `40m`, `6h`, `1h30m`, `1h30m15s` or a bare number of seconds."""
    if isinstance(text, int) and not isinstance(text, bool):
        seconds = text
    else:
        match = _DURATION.fullmatch(str(text).strip())
        if str(text).strip().isdigit():
            seconds = int(str(text).strip())
        elif not match or not any(match.groups()):
            raise ValueError(f"{text!r} is not a duration; write e.g. 90s, 40m, 6h or 1h30m")
        else:
            h, m, s = (int(g or 0) for g in match.groups())
            seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError(f"a duration must be more than 0 seconds, found {text!r}")
    return seconds


def format_duration(seconds: int) -> str:
    """`5400` -> `1h30m`: the shortest text `parse_duration` reads back as the same seconds."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    text = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")
    return text or "0s"


def parse_size(text: str) -> int:
    """MiB in `512MiB`, `6GiB`, `1TiB` (powers of 1024) or `96GB`, `80G` (powers of 1000).

    Decimal units are converted exactly and rounded down: 96GB = 91552 MiB.
    """
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 512MiB, 6GiB, 80GB")
    number, unit = match.groups()
    unit_key = unit.lower().removesuffix("b")
    mib = int(float(number) * _BYTES_PER_UNIT[unit_key]) // _MIB
    if mib <= 0:
        raise ValueError(f"{text!r} is less than 1 MiB; give a larger size")
    return mib


def format_size(mib: int) -> str:
    """`6144` -> `6GiB`, `91552` -> `91552MiB`."""
    for unit, per in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mib % per == 0:
            return f"{mib // per}{unit}"
    return f"{mib}MiB"


def natural_sort(names: Iterable[str]) -> list[str]:
    """Sort names as people do: `2`, `4a`, `10`, `gemini`."""

    def key(name: str) -> tuple[tuple[Any, ...], str]:
        parts = re.split(r"(\d+)", name)
        return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name

    return sorted(names, key=key)


def parse_compute_capability(text: str) -> tuple[int, int]:
    """`8.0` -> (8, 0); `9` -> (9, 0)."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise ValueError(f'{text!r} is not a compute capability; write e.g. "8.0"')
    return int(match.group(1)), int(match.group(2) or 0)


# --- cron ------------------------------------------------------------------------------------

_CRON_FIELDS = (
    ("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31),
    ("month", 1, 12), ("day of week", 0, 7),
)  # fmt: skip
_CRON_ITEM = re.compile(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?")
_CRON_HINT = "e.g. '0 16 * * 6' is Saturdays at 16:00"


def cron_problem(expression: str) -> str | None:
    """Why a 5-field cron expression is invalid, or None if it is valid."""
    fields = expression.split()
    if len(fields) != len(_CRON_FIELDS):
        return (
            f"a schedule needs 5 fields (minute hour day-of-month month day-of-week), "
            f"found {len(fields)} in {expression!r}; {_CRON_HINT}"
        )
    for text, (what, low, high) in zip(fields, _CRON_FIELDS, strict=True):
        for item in text.split(","):
            problem = _cron_item_problem(item, low, high)
            if problem:
                return f"{what} field {text!r}: {problem}; {_CRON_HINT}"
    return None


def cron_matches(expression: str, moment: datetime) -> bool:
    """Whether a valid cron expression fires in `moment`'s minute (in `moment`'s time zone).
    As in cron, when both day fields are restricted a match of either one is enough."""
    fields = expression.split()
    weekday = moment.isoweekday() % 7  # cron: 0 and 7 are Sunday
    values = (moment.minute, moment.hour, moment.day, moment.month, weekday)
    hits = [
        _cron_field_matches(text, value, low, high)
        for text, value, (_, low, high) in zip(fields, values, _CRON_FIELDS, strict=True)
    ]
    minute, hour, day, month, dow = hits
    restricted = fields[2] != "*" and fields[4] != "*"
    days = (day or dow) if restricted else (day and dow)
    return minute and hour and month and days


def _cron_field_matches(text: str, value: int, low: int, high: int) -> bool:
    for item in text.split(","):
        match = _CRON_ITEM.fullmatch(item)
        if match is None:
            continue
        star, start, end, step = match.groups()
        first = low if star == "*" else int(start)
        last = high if star == "*" or (step and end is None) else int(end or start)
        allowed = range(first, last + 1, int(step or 1))
        if value in allowed or (high == 7 and value == 0 and 7 in allowed):
            return True
    return False


def _cron_item_problem(item: str, low: int, high: int) -> str | None:
    match = _CRON_ITEM.fullmatch(item)
    if not match:
        return f"{item!r} is not *, */n, a, a-b or a-b/n"
    _, start, end, step = match.groups()
    numbers = [int(n) for n in (start, end) if n is not None]
    if any(not low <= n <= high for n in numbers):
        return f"{item!r} is outside {low}-{high}"
    if len(numbers) == 2 and numbers[0] > numbers[1]:
        return f"range {item!r} runs backwards"
    if step is not None and int(step) < 1:
        return f"step in {item!r} must be at least 1"
    return None


# --- reading YAML nodes ----------------------------------------------------------------------


class _Invalid(ValueError):
    """A value is wrong; the message says what to write instead."""


class _Bad:
    """Marks a value that was reported as an issue and must not be used."""


_BAD = _Bad()
FieldParser = Callable[["_Reader", Node, str], Any]
NULL_TAG = "tag:yaml.org,2002:null"
STR_TAG = "tag:yaml.org,2002:str"


def _construct(node: ScalarNode) -> Any:
    try:
        return SafeConstructor().construct_object(node)
    except (yaml.YAMLError, ValueError, KeyError) as exc:  # an explicit tag the text does not fit
        tag = str(node.tag).rsplit(":", 1)[-1]
        raise _Invalid(
            f"{_found(node)} is not a valid !!{tag}; fix the value or remove the tag"
        ) from exc


def _found(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == NULL_TAG:
        return "nothing (null)"
    text = str(node.value)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _typed(node: Node, expected: str, *types: type) -> Any:
    """The scalar's value if it has one of `types` (a bool is never an int here)."""
    value = _construct(node) if isinstance(node, ScalarNode) else None
    if (
        not isinstance(node, ScalarNode)
        or not isinstance(value, types)
        or (isinstance(value, bool) and bool not in types)
    ):
        raise _Invalid(f"expected {expected}, found {_found(node)}")
    return value


def _text(node: Node, expected: str) -> str:
    """The scalar as written (so `4090` and `8.0` keep their spelling), never null or a bool."""
    value = _typed(node, expected, str, int, float)
    return str(node.value) if not isinstance(value, str) else value


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _did_you_mean(key: str, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1)
    if close:
        return f"unknown key {key!r}; did you mean {close[0]!r}?"
    return f"unknown key {key!r}; valid keys are {', '.join(sorted(allowed))}"


class _Reader:
    """Walks composed YAML, collecting every issue with its line and key path."""

    def __init__(self, filename: str):
        self.filename = filename
        self.issues: list[ConfigIssue] = []
        self.lines: dict[str, int] = {}
        self.sized: dict[str, Batch] = {}  # batches whose gpus and GPU constraints are valid

    def add(self, where: Node | int | None, path: str, message: str) -> None:
        line = _line(where) if isinstance(where, Node) else where
        self.issues.append(ConfigIssue(self.filename, line, path, message))

    def leaf(self, parse: Callable[[Node], Any], node: Node, path: str) -> Any:
        try:
            return parse(node)
        except _Invalid as exc:
            self.add(node, path, str(exc))
            return _BAD

    def mapping(
        self,
        node: Node,
        path: str,
        allowed: Iterable[str] | None = None,
        required: Mapping[str, str] | None = None,
    ) -> dict[str, Node] | None:
        """Key -> value node; reports a non-mapping, odd, repeated, unknown and missing keys."""
        if not isinstance(node, MappingNode):
            self.add(node, path, f"expected a mapping of keys, found {_found(node)}")
            return None
        values: dict[str, Node] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            if key is None:
                continue
            if key in values:
                self.add(key_node, _join(path, key), "repeated key; keep only one")
                continue
            self.lines[_join(path, key)] = _line(key_node)
            values[key] = value_node
        self._check_keys(node, path, values, allowed, required)
        return values

    def _key(self, key_node: Node, path: str) -> str | None:
        if isinstance(key_node, ScalarNode) and key_node.tag != NULL_TAG and key_node.value:
            return str(key_node.value)
        self.add(key_node, path, f"keys must be plain names, found {_found(key_node)}")
        return None

    def _check_keys(
        self,
        node: Node,
        path: str,
        values: dict[str, Node],
        allowed: Iterable[str] | None,
        required: Mapping[str, str] | None,
    ) -> None:
        if allowed is not None:
            allowed = list(allowed)
            for key in (k for k in values if k not in allowed):
                self.add(
                    self.lines[_join(path, key)], _join(path, key), _did_you_mean(key, allowed)
                )
        for key, hint in (required or {}).items():
            if key not in values:
                self.add(node, path, f"missing required key {key!r}; {hint}")

    def fields(
        self, values: Mapping[str, Node], path: str, table: Mapping[str, tuple[str, FieldParser]]
    ) -> dict[str, Any]:
        """Dataclass keyword arguments from the keys in `table`; reported values are `_BAD`."""
        kwargs: dict[str, Any] = {}
        for key, node in values.items():
            if key in table:
                name, parse = table[key]
                kwargs[name] = parse(self, node, _join(path, key))
        return kwargs


def _complete(kwargs: dict[str, Any], *needed: str) -> bool:
    """Whether every value was valid and every needed one is there."""
    return all(v is not _BAD for v in kwargs.values()) and all(k in kwargs for k in needed)


def _leaf(parse: Callable[[Node], Any]) -> FieldParser:
    return lambda r, node, path: r.leaf(parse, node, path)


def _one_or_many(item: Callable[[Node], str], empty_hint: str | None = None) -> FieldParser:
    """A field that is one string or a list of them; `empty_hint` refuses an empty list."""

    def parse(r: _Reader, node: Node, path: str) -> Any:
        if isinstance(node, ScalarNode) and node.tag != NULL_TAG:
            value = r.leaf(item, node, path)
            return _BAD if value is _BAD else (value,)
        if not isinstance(node, SequenceNode):
            r.add(node, path, f"expected a string or a list of strings, found {_found(node)}")
            return _BAD
        if not node.value and empty_hint:
            r.add(node, path, f"the list is empty; {empty_hint}")
            return _BAD
        values = [r.leaf(item, n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        return _BAD if any(v is _BAD for v in values) else tuple(values)

    return parse


# --- leaf values -----------------------------------------------------------------------------


def _version(node: Node) -> int:
    value = _typed(node, "the number 1 (write version: 1)", int)
    if value != 1:
        raise _Invalid(f"version {value} is not supported; this gpuci reads version: 1")
    return 1


def _non_empty(node: Node) -> str:
    value = _text(node, "a string")
    if not value.strip():
        raise _Invalid("the string is empty; give a value or remove the key")
    return value


def _label(node: Node) -> str:
    value = _non_empty(node)
    if len(value) > MAX_LABEL_CHARS:
        raise _Invalid(
            f"GitHub labels are at most {MAX_LABEL_CHARS} characters, found {len(value)}"
        )
    return value


def _gpu_count(node: Node) -> int:
    value = _typed(node, f"a whole number of GPUs from 0 to {MAX_GPUS}", int)
    if not 0 <= value <= MAX_GPUS:
        raise _Invalid(f"gpus must be from 0 to {MAX_GPUS}, found {value}")
    return int(value)


def _test_path(node: Node) -> str:
    value = _non_empty(node)
    parts = PurePosixPath(value.split("::")[0]).parts
    if value.startswith("/") or re.match(r"[A-Za-z]:[\\/]", value):
        raise _Invalid(f"test path {value!r} is absolute; give it relative to the repository root")
    if ".." in parts:
        raise _Invalid(f"test path {value!r} leaves the repository ('..'); remove the '..'")
    if value.startswith("-"):
        raise _Invalid(f"{value!r} is an option, not a test path; put it in pytest_args")
    return value


def _duration(node: Node) -> int:
    value = _typed(node, "a duration such as 90s, 40m, 6h or 1h30m", str, int)
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _Invalid(str(exc)) from exc


def _size(node: Node) -> int:
    if isinstance(node, ScalarNode) and isinstance(_construct(node), int | float):
        raise _Invalid(f"{node.value} has no unit; write e.g. {node.value}GiB or {node.value}MiB")
    value = _typed(node, "a size such as 512MiB, 6GiB or 80GB", str)
    try:
        return parse_size(value)
    except ValueError as exc:
        raise _Invalid(str(exc)) from exc


def _workers(node: Node) -> int | str:
    value = _typed(node, 'a number of workers (1 or more) or "auto"', int, str)
    if value == "auto" or (isinstance(value, int) and value >= 1):
        return value
    raise _Invalid(f'workers must be 1 or more, or "auto", found {_found(node)}')


def _compute_capability(node: Node) -> tuple[int, int]:
    try:
        return parse_compute_capability(_text(node, 'a compute capability such as "8.0"'))
    except ValueError as exc:
        raise _Invalid(str(exc)) from exc


def _flag(node: Node) -> bool:
    return bool(_typed(node, "true or false", bool))


def _trigger(node: Node) -> str:
    value = _typed(node, "the string pull_request", str)
    if value != "pull_request":
        raise _Invalid(
            f"trigger {value!r} is not supported; use pull_request (runs for trusted PRs), "
            "schedule for timed runs, or no trigger to run the layer only on command"
        )
    return "pull_request"


def _schedule(node: Node) -> str:
    value = _typed(node, "a cron expression such as '0 16 * * 6'", str)
    problem = cron_problem(value)
    if problem:
        raise _Invalid(problem)
    return " ".join(value.split())


# --- composite values ------------------------------------------------------------------------

# Options the runner sets itself; a repository must not set them in pytest_args.
_RESERVED_OPTIONS = {
    "--junitxml": "gpuci sets it to collect results",
    "--junit-xml": "gpuci sets it to collect results",
    "-n": "use the batch's workers key",
    "--numprocesses": "use the batch's workers key",
}


def _reserved_option(arg: str) -> str | None:
    for option, reason in _RESERVED_OPTIONS.items():
        short = not option.startswith("--") and arg.startswith(option) and not arg.startswith("--")
        if arg == option or arg.startswith(option + "=") or short:
            return f"{option} is not allowed in pytest_args: {reason}"
    return None


def _pytest_args(r: _Reader, node: Node, path: str) -> Any:
    if isinstance(node, ScalarNode) and node.tag == STR_TAG:
        try:
            args: Any = tuple(shlex.split(node.value))
        except ValueError as exc:
            r.add(node, path, f"cannot split {_found(node)} into arguments ({exc}); check quotes")
            return _BAD
    else:
        args = _one_or_many(lambda n: _typed(n, "a string (quote numbers)", str))(r, node, path)
    if args is _BAD:
        return _BAD
    problems = [p for p in map(_reserved_option, args) if p]
    for problem in problems:
        r.add(node, path, problem)
    return _BAD if problems else args


def _env(r: _Reader, node: Node, path: str) -> Any:
    values = r.mapping(node, path)
    if values is None:
        return _BAD
    env = {name: r.leaf(_env_value, value, _join(path, name)) for name, value in values.items()}
    for name in env:
        problem = _env_name_problem(name)
        if problem:
            r.add(r.lines[_join(path, name)], _join(path, name), problem)
            env[name] = _BAD
    return _BAD if any(v is _BAD for v in env.values()) else env


def _env_name_problem(name: str) -> str | None:
    if name == "CUDA_VISIBLE_DEVICES":
        return "CUDA_VISIBLE_DEVICES is set by gpuci from the leased GPUs; remove it"
    if not _ENV_NAME.fullmatch(name):
        return (
            f"{name!r} is not a valid variable name; use letters, digits and _, not first a digit"
        )
    return None


def _env_value(node: Node) -> str:
    if not isinstance(node, ScalarNode) or node.tag == NULL_TAG:
        raise _Invalid(f"expected a string value, found {_found(node)}; write '' for an empty one")
    return str(node.value)


# --- runtimes ------------------------------------------------------------------------------

_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_VERSION = re.compile(r"\d+(?:\.\d+)*")


def _profile_name(node: Node) -> str:
    value = _non_empty(node)
    if not _NAME.fullmatch(value):
        raise _Invalid(f"runtime name {value!r} may use only letters, digits, '.', '_', '-'")
    return value


def _base_name(node: Node) -> str:
    value = _non_empty(node)
    if not _NAME.fullmatch(value):
        raise _Invalid(
            f"base {value!r} may use only letters, digits, '.', '_', '-' "
            "(it names a base environment in the GPU host's runtimes file)"
        )
    return value


def _image_ref(node: Node) -> str:
    value = _non_empty(node)
    if not _IMAGE.fullmatch(value):
        raise _Invalid(f"{value!r} is not an image reference; write e.g. pytorch/pytorch:2.13")
    return value


CONCLUSION_MODES = ("strict", "new_failures")


def _conclusion(node: Node) -> str:
    value = _typed(node, "strict or new_failures", str)
    if value not in CONCLUSION_MODES:
        raise _Invalid(
            f"conclusion {value!r} is not strict (any failure fails the run) or new_failures"
            " (only failures that are new against the default branch's history fail it)"
        )
    return str(value)


def _network(node: Node) -> str:
    value = _typed(node, "host or none", str)
    if value not in NETWORKS:
        raise _Invalid(f"network {value!r} is not host (the host's network) or none (no network)")
    return str(value)


def _version_text(node: Node) -> str:
    value = _text(node, 'a version such as "2.13" (quote it)')
    if not _VERSION.fullmatch(value):
        raise _Invalid(f'{value!r} is not a version; write e.g. "3.11", "2.13" or "13.0"')
    return value


def _expect(r: _Reader, node: Node, path: str) -> Any:
    values = r.mapping(node, path, allowed=EXPECT_KEYS)
    if values is None:
        return _BAD
    expect = {key: r.leaf(_version_text, value, _join(path, key)) for key, value in values.items()}
    return _BAD if any(v is _BAD for v in expect.values()) else expect


def _caches(r: _Reader, node: Node, path: str) -> Any:
    """A list of cache names, or a mapping of cache name -> size limit (null: the host's)."""
    if isinstance(node, SequenceNode):
        names = [r.leaf(_cache_name, n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        return _BAD if _BAD in names else dict.fromkeys(names)
    values = r.mapping(node, path)
    if values is None:
        return _BAD
    caches: dict[str, Any] = {}
    for name, value in values.items():
        where = _join(path, name)
        if name not in CACHE_NAMES:
            r.add(r.lines[where], where, _unknown_cache(name))
            caches[name] = _BAD
        elif isinstance(value, ScalarNode) and value.tag == NULL_TAG:
            caches[name] = None
        else:
            caches[name] = r.leaf(_size, value, where)
    return _BAD if any(v is _BAD for v in caches.values()) else caches


def _cache_name(node: Node) -> str:
    value = _non_empty(node)
    if value not in CACHE_NAMES:
        raise _Invalid(_unknown_cache(value))
    return value


def _unknown_cache(name: str) -> str:
    close = difflib.get_close_matches(name, CACHE_NAMES, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"caches are {', '.join(CACHE_NAMES)}"
    return f"unknown cache {name!r}; {hint}"


_PROFILE_KEYS: dict[str, tuple[str, FieldParser]] = {
    "base": ("base", _leaf(_base_name)),
    "image": ("image", _leaf(_image_ref)),
    "setup": ("setup", _one_or_many(_non_empty)),
    "env": ("env", _env),
    "expect": ("expect", _expect),
    "caches": ("caches", _caches),
    "network": ("network", _leaf(_network)),
}


def _profile(r: _Reader, name: str, node: Node, path: str) -> Runtime | None:
    values = r.mapping(node, path, allowed=_PROFILE_KEYS)
    if values is None:
        return None
    before = len(r.issues)
    kwargs = r.fields(values, path, _PROFILE_KEYS)
    if "base" in values and "image" in values:
        where = _join(path, "image")
        r.add(r.lines[where], where, "a runtime has either base (a Python environment the GPU "
              "host provides) or image (a container), not both; remove one")  # fmt: skip
    if not _complete(kwargs) or len(r.issues) > before:
        return None
    return Runtime(name=name, **kwargs)


def _runtime(r: _Reader, node: Node, path: str) -> Any:
    """Top-level `runtime`: the name of the default profile, or the default profile itself."""
    if isinstance(node, ScalarNode) and node.tag != NULL_TAG:
        return r.leaf(_profile_name, node, path)
    profile = _profile(r, DEFAULT_RUNTIME, node, path)
    return _BAD if profile is None else profile


def _runtimes(r: _Reader, node: Node) -> dict[str, Runtime]:
    values = r.mapping(node, "runtimes")
    if values is None:
        return {}
    profiles = {}
    for name, profile_node in values.items():
        path = f"runtimes.{name}"
        named = _check_name(r, path, name, "runtime")
        profile = _profile(r, name, profile_node, path)
        if named and profile is not None:
            profiles[name] = profile
    return profiles


def _resolve_runtimes(
    r: _Reader, chosen: Any, profiles: dict[str, Runtime], defined: Iterable[str]
) -> tuple[dict[str, Runtime], str]:
    """Every profile (the default one included) and the default's name; references checked."""
    profiles = dict(profiles)
    default = DEFAULT_RUNTIME
    if isinstance(chosen, Runtime):
        if DEFAULT_RUNTIME in profiles:
            r.add(r.lines.get("runtime"), "runtime", f"runtimes also defines {DEFAULT_RUNTIME!r}; "
                  "name the default (runtime: NAME) or rename that profile")  # fmt: skip
        profiles[DEFAULT_RUNTIME] = chosen
    elif isinstance(chosen, str):
        problem = _runtime_problem(chosen, profiles, defined, "the default runtime")
        if problem:
            r.add(r.lines.get("runtime"), "runtime", problem)
        default = chosen
    profiles.setdefault(DEFAULT_RUNTIME, Runtime(DEFAULT_RUNTIME))
    return profiles, default


def _runtime_problem(
    name: str, profiles: Mapping[str, Runtime], defined: Iterable[str], who: str
) -> str | None:
    if name in profiles or name in defined:
        return None  # a defined profile (one with errors is reported at its own line)
    if not profiles:
        return (
            f"{who} names runtime {name!r}, but there is no runtimes mapping; define it "
            f"(runtimes: {{{name}: {{base: NAME}}}}) or write runtime: {{setup: [...]}}"
        )
    names = ", ".join(natural_sort(profiles))
    return f"{who} names runtime {name!r}, which is not defined in runtimes; defined: {names}"


# --- batches and layers ----------------------------------------------------------------------

_BATCH_KEYS: dict[str, tuple[str, FieldParser]] = {
    "gpus": ("gpus", _leaf(_gpu_count)),
    "tests": ("tests", _one_or_many(_test_path, "list test paths, or remove tests")),
    "timeout": ("timeout_s", _leaf(_duration)),
    "markers": ("markers", _leaf(_non_empty)),
    "pytest_args": ("pytest_args", _pytest_args),
    "env": ("env", _env),
    "workers": ("workers", _leaf(_workers)),
    "vram_per_worker": ("vram_per_worker_mb", _leaf(_size)),
    "gpu_model": ("gpu_model", _leaf(_non_empty)),
    "min_memory": ("min_memory_mb", _leaf(_size)),
    "min_compute_capability": ("min_compute_capability", _leaf(_compute_capability)),
    "allow_no_tests": ("allow_no_tests", _leaf(_flag)),
    "runtime": ("runtime", _leaf(_profile_name)),
    "network": ("network", _leaf(_network)),
}
_BATCH_REQUIRED = {"gpus": "say how many GPUs the batch needs, e.g. gpus: 1 (0 for CPU only)"}
_LAYER_REQUIRED = {"batches": "list the layer's batches, e.g. batches: [unit], or batches: all"}
_TOP_REQUIRED = {
    "version": "start the file with version: 1",
    "batches": "define the batches, e.g. batches: {unit: {gpus: 1, tests: [tests]}}",
}
_GPU_CONSTRAINTS = ("gpu_model", "min_memory", "min_compute_capability")
_SIZING_FIELDS = ("gpus", *(_BATCH_KEYS[key][0] for key in _GPU_CONSTRAINTS))  # where it fits


def _check_name(r: _Reader, path: str, name: str, what: str) -> bool:
    if _NAME.fullmatch(name):
        return True
    r.add(r.lines[path], path, f"{what} name {name!r} may use only letters, digits, '.', '_', '-'")
    return False


def _batches(r: _Reader, node: Node) -> tuple[dict[str, Batch], list[str]]:
    """Valid batches, and every defined name (valid or not) for layer references."""
    values = r.mapping(node, "batches")
    if values is None:
        return {}, []
    if not values:
        r.add(node, "batches", "no batches defined; add one, e.g. unit: {gpus: 1, tests: [tests]}")
    batches: dict[str, Batch] = {}
    for name, batch_node in values.items():
        path = f"batches.{name}"
        named = _check_name(r, path, name, "batch")
        batch = _batch(r, name, batch_node, path)
        if named and batch is not None:
            batches[name] = batch
    return batches, list(values)


def _batch(r: _Reader, name: str, node: Node, path: str) -> Batch | None:
    values = r.mapping(node, path, allowed=_BATCH_KEYS, required=_BATCH_REQUIRED)
    if values is None:
        return None
    kwargs = r.fields(values, path, _BATCH_KEYS)
    sizing = {k: kwargs[k] for k in _SIZING_FIELDS if k in kwargs}
    if _complete(sizing, "gpus"):
        r.sized[name] = Batch(name=name, tests=(), **sizing)
    before = len(r.issues)
    if isinstance(kwargs.get("gpus"), int):
        _check_batch_keys(r, path, values, kwargs)
    if not _complete(kwargs, "gpus") or len(r.issues) > before:
        return None
    return Batch(name=name, **{"tests": (), **kwargs})


def _check_batch_keys(
    r: _Reader, path: str, values: dict[str, Node], kwargs: dict[str, Any]
) -> None:
    """Rules that join keys: GPU constraints need GPUs, workers: auto needs vram_per_worker."""

    def report(key: str, message: str) -> None:
        r.add(r.lines[_join(path, key)], _join(path, key), message)

    if kwargs["gpus"] == 0:
        for key in (k for k in _GPU_CONSTRAINTS if k in values):
            report(key, f"the batch asks for gpus: 0, so {key} has no GPU to apply to; "
                        "set gpus or remove it")  # fmt: skip
    auto = kwargs.get("workers") == "auto"
    if auto and "vram_per_worker" not in values:
        report("workers", "workers: auto needs vram_per_worker (e.g. 6GiB) to size the workers")
    if auto and kwargs["gpus"] == 0:
        report("workers", "workers: auto divides GPU memory, and the batch has gpus: 0; "
                          "give a number of workers")  # fmt: skip
    if "vram_per_worker" in values and not auto and kwargs.get("workers") is not _BAD:
        report("vram_per_worker", "vram_per_worker applies only with workers: auto; "
                                  "set workers: auto or remove it")  # fmt: skip


def _layer_batches(defined: list[str], layer: str) -> FieldParser:
    """A layer's `batches`: "all", or a list of names that must all be defined batches."""

    def parse(r: _Reader, node: Node, path: str) -> Any:
        if isinstance(node, ScalarNode) and node.value == "all":
            return tuple(natural_sort(defined))
        if not isinstance(node, SequenceNode) or not node.value:
            r.add(node, path, f'expected a list of batch names or "all", found {_found(node)}')
            return _BAD
        names = [r.leaf(_batch_name, n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        ok = _BAD not in names
        for i, (name, item) in enumerate(zip(names, node.value, strict=True)):
            problem = _layer_name_problem(name, names[:i], defined, layer)
            if problem:
                r.add(item, f"{path}[{i}]", problem)
                ok = False
        return tuple(names) if ok else _BAD

    return parse


def _batch_name(node: Node) -> str:
    return _text(node, "a batch name")


def _layer_name_problem(
    name: Any, earlier: list[Any], defined: list[str], layer: str
) -> str | None:
    if name is _BAD:
        return None  # already reported
    if name in earlier:
        return f"batch {name} is listed twice; remove the repeat"
    if name not in defined:
        names = ", ".join(natural_sort(defined)) or "none"
        return f"layer {layer} names batch {name}, which is not defined; defined batches: {names}"
    return None


def _layers(r: _Reader, node: Node, defined: list[str]) -> dict[str, Layer]:
    values = r.mapping(node, "layers")
    if values is None:
        return {}
    layers: dict[str, Layer] = {}
    for name, layer_node in values.items():
        path = f"layers.{name}"
        named = _check_name(r, path, name, "layer")
        table = {
            "batches": ("batches", _layer_batches(defined, name)),
            "trigger": ("trigger", _leaf(_trigger)),
            "schedule": ("schedule", _leaf(_schedule)),
        }
        fields = r.mapping(layer_node, path, allowed=table, required=_LAYER_REQUIRED)
        kwargs = r.fields(fields, path, table) if fields is not None else None
        if named and kwargs is not None and _complete(kwargs, "batches"):
            layers[name] = Layer(name=name, **kwargs)
    return layers


# --- the whole file --------------------------------------------------------------------------

_TOP_KEYS: dict[str, tuple[str, FieldParser]] = {
    "version": ("version", _leaf(_version)),
    "approval_label": ("approval_label", _leaf(_label)),
    "runtime": ("runtime", _runtime),
    "pytest_args": ("pytest_args", _pytest_args),
    "env": ("env", _env),
    "conclusion": ("conclusion", _leaf(_conclusion)),
}
_ALL_TOP_KEYS = (*_TOP_KEYS, "runtimes", "layers", "batches")


def load_config(text: str, filename: str = ".gpuci.yml") -> Config:
    """The config in `text`; raises ConfigError listing every issue, each with line and key path."""
    r = _Reader(filename)
    root = _compose(r, text)
    if root is None:
        raise ConfigError(r.issues)
    values = r.mapping(root, "", allowed=_ALL_TOP_KEYS, required=_TOP_REQUIRED)
    if values is None:
        raise ConfigError(r.issues)
    kwargs = r.fields(values, "", _TOP_KEYS)
    batches, defined = _batches(r, values["batches"]) if "batches" in values else ({}, [])
    layers = _layers(r, values["layers"], defined) if "layers" in values else {}
    profiles = _runtimes(r, values["runtimes"]) if "runtimes" in values else {}
    runtimes, default = _resolve_runtimes(
        r, kwargs.pop("runtime", None), profiles, _defined_runtimes(values)
    )
    _check_batch_runtimes(r, batches, runtimes, _defined_runtimes(values))
    if r.issues:
        raise ConfigError(sorted(r.issues, key=_by_line), r.sized, r.lines)
    return Config(
        batches=batches,
        layers=layers,
        runtimes=runtimes,
        default_runtime=default,
        lines=r.lines,
        **kwargs,
    )


def _defined_runtimes(values: Mapping[str, Node]) -> list[str]:
    """Every profile name written under `runtimes`, valid or not."""
    node = values.get("runtimes")
    if not isinstance(node, MappingNode):
        return []
    return [str(key.value) for key, _ in node.value if isinstance(key, ScalarNode)]


def _check_batch_runtimes(
    r: _Reader, batches: dict[str, Batch], runtimes: Mapping[str, Runtime], defined: list[str]
) -> None:
    for name in list(batches):
        wanted = batches[name].runtime
        problem = wanted and _runtime_problem(wanted, runtimes, defined, f"batch {name}")
        if problem:
            path = f"batches.{name}.runtime"
            r.add(r.lines.get(path), path, problem)
            del batches[name]


def _by_line(issue: ConfigIssue) -> int:
    return issue.line or 0


def _compose(r: _Reader, text: str) -> Node | None:
    """The YAML document's root node, refusing huge texts and anchors before building any tree."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        r.add(
            None, "", f"the file is over {MAX_CONFIG_BYTES // _MIB} MiB; a config is much smaller"
        )
        return None
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            refusal = _refusal(event)
            if refusal:
                r.add(_line_of(event.start_mark), "", refusal)
        if r.issues:
            return None
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = _line_of(mark) if mark else None
        r.add(line, "", f"YAML syntax error: {exc.problem}; check indentation and quotes here")
        return None
    except yaml.YAMLError as exc:
        r.add(None, "", f"YAML error: {exc}")
        return None
    if root is None:
        r.add(1, "", "the file is empty; start with version: 1 and a batches mapping")
    return root


_PLAIN_TAGS = {
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")
}


def _refusal(event: yaml.Event) -> str | None:
    """Why a parse event is refused: anchors and aliases (billion laughs), and unusual tags."""
    if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
        return "YAML anchors and aliases (&name, *name) are not supported; write the values out"
    tag = getattr(event, "tag", None)
    if tag and tag not in _PLAIN_TAGS and tag != "!":
        return f"YAML tag {tag!r} is not supported; remove it"
    return None


def _line_of(mark: Any) -> int:
    return int(mark.line) + 1


# --- host inventories ------------------------------------------------------------------------


def load_hosts(text: str, filename: str) -> dict[str, list[HostGpu]]:
    """Host name -> its GPUs, from inventory JSON; per-GPU keys beyond the three used are ignored.

    A host is a list of GPUs, or `{"gpus": [...], "runtimes": ["base:default", ...]}` (what
    `gpuci gpus --json --runtimes` prints). Memory is `memory_mb` (MiB) or `memory_gb`
    (decimal GB, rounded down to MiB).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        issue = ConfigIssue(filename, exc.lineno, "", f"invalid JSON: {exc.msg}")
        raise ConfigError([issue]) from exc
    lines = _json_lines(text)
    issues: list[ConfigIssue] = []

    def report(path: str, message: str) -> None:
        issues.append(ConfigIssue(filename, lines.get(path), path, message))

    if not isinstance(data, dict):
        report("", 'expected an object of host name -> list of GPUs, e.g. {"h20-01": [...]}')
        raise ConfigError(issues)
    hosts = {name: _host_gpus(name, _gpus_of(entry), report) for name, entry in data.items()}
    if issues:
        raise ConfigError(issues)
    return hosts


def _gpus_of(entry: Any) -> Any:
    return entry.get("gpus") if isinstance(entry, dict) else entry


def inventory_runtimes(text: str) -> dict[str, frozenset[str]]:
    """Host name -> the runtimes it provides, from a valid inventory; a host given as a plain
    list of GPUs (or without `runtimes`) provides only the default base."""
    data = json.loads(text)
    provides = {}
    for name, entry in data.items():
        listed = entry.get("runtimes") if isinstance(entry, dict) else None
        if isinstance(listed, list) and all(isinstance(r, str) for r in listed):
            provides[name] = frozenset(listed)
        else:
            provides[name] = frozenset({f"base:{DEFAULT_BASE}"})
    return provides


def check_runtimes(
    config: Config, provides: Mapping[str, frozenset[str]], filename: str
) -> list[ConfigIssue]:
    """One issue per batch whose runtime no host in the inventory provides."""
    issues = []
    for name in natural_sort(config.batches):
        runtime = config.runtime_for(config.batches[name])
        if any(runtime.requirement in found for found in provides.values()):
            continue
        path = f"batches.{name}"
        what = "a container engine" if runtime.image else f"base {runtime.base or DEFAULT_BASE}"
        reason = (
            f"batch {name} uses runtime {runtime.name}, which needs {what}; no host in the "
            "inventory provides it (hosts list theirs with gpuci gpus --json --runtimes)"
        )
        issues.append(ConfigIssue(filename, config.lines.get(path), path, reason))
    return issues


def _host_gpus(host: str, gpus: Any, report: Callable[[str, str], None]) -> list[HostGpu]:
    if not isinstance(gpus, list):
        report(host, f"expected a list of GPUs, found {_json_kind(gpus)}")
        return []
    result = [_host_gpu(gpu, f"{host}[{i}]", report) for i, gpu in enumerate(gpus)]
    return [gpu for gpu in result if gpu is not None]


def _host_gpu(gpu: Any, path: str, report: Callable[[str, str], None]) -> HostGpu | None:
    if not isinstance(gpu, dict):
        report(path, f"expected a GPU object, found {_json_kind(gpu)}")
        return None
    name, memory_mb, capability = gpu.get("name"), _memory_mb(gpu), None
    if not isinstance(name, str) or not name:
        report(path, 'each GPU needs "name", e.g. "NVIDIA H20"')
    if memory_mb is None:
        report(path, 'each GPU needs "memory_gb" or "memory_mb", a number above 0')
    try:
        capability = parse_compute_capability(str(gpu.get("compute_capability", "")))
    except ValueError:
        report(path, 'each GPU needs "compute_capability", e.g. "9.0"')
    if not isinstance(name, str) or not name or memory_mb is None or capability is None:
        return None
    return HostGpu(name, memory_mb, capability)


def _memory_mb(gpu: dict[str, Any]) -> int | None:
    mb, gb = _positive(gpu.get("memory_mb")), _positive(gpu.get("memory_gb"))
    if mb is not None:
        return int(mb)
    if gb is not None:
        return int(gb * 1000**3) // _MIB
    return None


def _positive(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "a number" if value is not None else "null")


def _json_lines(text: str) -> dict[str, int]:
    """Path (`host`, `host[0]`) -> line, for JSON inventories; empty if YAML cannot read it."""
    try:
        root = yaml.compose(text.replace("\t", " "), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}
    if isinstance(root, MappingNode):
        for key, value in root.value:
            lines[str(key.value)] = _line(key)
            items = value.value if isinstance(value, SequenceNode) else []
            lines.update({f"{key.value}[{i}]": _line(item) for i, item in enumerate(items)})
    return lines


# --- batches against hosts -------------------------------------------------------------------


def _requirements(batch: Batch) -> list[tuple[str, Callable[[HostGpu], bool]]]:
    """Each per-GPU constraint of the batch: its wording and its test."""
    found: list[tuple[str, Callable[[HostGpu], bool]]] = []
    if batch.gpu_model:
        found.append(
            (f"model {batch.gpu_model}", lambda g: model_matches(batch.gpu_model or "", g.name))
        )
    if batch.min_memory_mb:
        need = batch.min_memory_mb
        found.append((f"at least {format_size(need)} memory", lambda g: g.memory_mb >= need))
    if batch.min_compute_capability:
        cc = batch.min_compute_capability
        found.append(
            (f"compute capability >= {cc[0]}.{cc[1]}", lambda g: g.compute_capability >= cc)
        )
    return found


def model_matches(model: str, gpu_name: str) -> bool:
    """`H20` matches "NVIDIA H20" but not "NVIDIA H200": case-insensitive, whole words only."""
    pattern = rf"(?<![A-Za-z0-9]){re.escape(model.strip())}(?![A-Za-z0-9])"
    return re.search(pattern, gpu_name, re.IGNORECASE) is not None


def gpu_matches(batch: Batch, gpu: HostGpu) -> bool:
    """Whether one GPU meets all of the batch's per-GPU constraints."""
    return all(test(gpu) for _, test in _requirements(batch))


def why_unrunnable(batch: Batch, hosts: Mapping[str, list[HostGpu]]) -> str | None:
    """Why no host can ever run the batch, or None when some host has enough matching GPUs."""
    if batch.gpus == 0:
        return None
    if not hosts:
        return f"batch {batch.name} needs {_gpus(batch.gpus)}; the inventory has no hosts"
    matching = {host: sum(gpu_matches(batch, g) for g in gpus) for host, gpus in hosts.items()}
    best = max(natural_sort(hosts), key=lambda h: (matching[h], len(hosts[h])))
    if matching[best] >= batch.gpus:
        return None
    wanted = " and ".join(text for text, _ in _requirements(batch))
    if not wanted:
        largest = len(hosts[best])
        return (
            f"batch {batch.name} needs {_gpus(batch.gpus)}; the largest host, {best}, has {largest}"
        )
    return (
        f"batch {batch.name} needs {_gpus(batch.gpus)} with {wanted}; best host {best} has "
        f"{_gpus(len(hosts[best]))}, {matching[best]} of them with {wanted}"
    )


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def check_hosts(
    batches: Mapping[str, Batch],
    lines: Mapping[str, int],
    hosts: Mapping[str, list[HostGpu]],
    filename: str,
) -> list[ConfigIssue]:
    """One issue per batch that no host in the inventory can run, at the batch's line."""
    issues = []
    for name in natural_sort(batches):
        reason = why_unrunnable(batches[name], hosts)
        if reason:
            path = f"batches.{name}"
            issues.append(ConfigIssue(filename, lines.get(path), path, reason))
    return issues


# --- the only file I/O: `gpuci config check` -------------------------------------------------


def check_file(path: Path, hosts_path: Path | None = None) -> list[ConfigIssue]:
    """Every issue in the config file and, given an inventory, every issue in it and every batch
    no host can run: the config's issues and its batches' sorted by line, then the inventory's.

    A batch is checked against hosts even when the file has other errors, as long as its `gpus`
    and GPU constraints were read validly; an inventory with errors checks no batch.
    """
    issues, batches, lines, config = _check_config(path)
    if hosts_path is None:
        return issues
    inventory = _check_inventory(hosts_path)
    if isinstance(inventory, list):
        return issues + inventory
    hosts, provides = inventory
    found = issues + check_hosts(batches, lines, hosts, str(path))
    if config is not None:  # runtimes are checked once the whole file reads
        found += check_runtimes(config, provides, str(path))
    return sorted(found, key=_by_line)


def _check_config(
    path: Path,
) -> tuple[list[ConfigIssue], Mapping[str, Batch], Mapping[str, int], Config | None]:
    """The file's issues, the batches (with key lines) that a hosts check can use, and the
    config when it is valid."""
    text = _read(path)
    if isinstance(text, ConfigIssue):
        return [text], {}, {}, None
    try:
        config = load_config(text, str(path))
    except ConfigError as exc:
        return exc.issues, exc.batches, exc.lines, None
    return [], config.batches, config.lines, config


def _check_inventory(
    path: Path,
) -> tuple[dict[str, list[HostGpu]], dict[str, frozenset[str]]] | list[ConfigIssue]:
    text = _read(path)
    if isinstance(text, ConfigIssue):
        return [text]
    try:
        return load_hosts(text, str(path)), inventory_runtimes(text)
    except ConfigError as exc:
        return exc.issues


def _read(path: Path) -> str | ConfigIssue:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return ConfigIssue(str(path), None, "", "the file is over 1 MiB; is it the right file?")
        return data.decode("utf-8")
    except OSError as exc:
        return ConfigIssue(str(path), None, "", f"cannot read the file: {exc.strerror or exc}")
    except UnicodeDecodeError:
        return ConfigIssue(str(path), None, "", "the file is not UTF-8 text; save it as UTF-8")
