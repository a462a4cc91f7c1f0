"""`/gpuci` comment commands: the grammar, its errors and help text, and the per-PR rate rule."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

PREFIX = "/gpuci"
MAX_COMMANDS = 10  # commands read from one comment; the rest are reported and ignored
MAX_BATCHES = 20  # batch names in one `run batch` command
MAX_LINE = 300  # characters in one command line
MAX_BODY = 65536  # characters of a comment looked at (GitHub's own comment limit)
MIN_SHA_PREFIX = 7

USAGE = "\n".join(
    [
        "| command | what |",
        "|---|---|",
        "| `/gpuci run batch NAME [NAME ...]` | run these batches at the PR's head commit |",
        "| `/gpuci run layer NAME` | run the batches of one layer |",
        "| `/gpuci run all` | run every batch |",
        "| `/gpuci rerun failed` | run again the batches that failed at the head commit |",
        "| `/gpuci cancel` | cancel this PR's queued and running batches |",
        "| `/gpuci approve [SHA]` | approve GPU runs of the head commit (fork PRs) |",
        "| `/gpuci status` | reply with the state of this PR's runs |",
        "| `/gpuci help` | reply with this help |",
    ]
)


class CommandKind(StrEnum):
    RUN_BATCHES = "run_batches"
    RUN_LAYER = "run_layer"
    RUN_ALL = "run_all"
    RERUN_FAILED = "rerun_failed"
    CANCEL = "cancel"
    APPROVE = "approve"
    STATUS = "status"
    HELP = "help"


RUN_KINDS = frozenset(
    {CommandKind.RUN_BATCHES, CommandKind.RUN_LAYER, CommandKind.RUN_ALL, CommandKind.RERUN_FAILED}
)


@dataclass(frozen=True)
class Command:
    """One valid command. `batches` is resolved: the named ones, the layer's, or all of them
    (naturally sorted, no duplicates); empty for RERUN_FAILED, whose batches come from results."""

    kind: CommandKind
    batches: tuple[str, ...] = ()
    layer: str | None = None
    sha: str | None = None  # APPROVE only: the (prefix of the) commit the commenter reviewed
    line: str = ""

    @property
    def runs(self) -> bool:
        """Whether the command asks for GPU runs."""
        return self.kind in RUN_KINDS


@dataclass(frozen=True)
class CommandError:
    """A `/gpuci` line that is not a valid command; `message` is markdown for the reply."""

    line: str
    message: str


ParseResult = Command | CommandError


def parse_comment(
    body: str, valid_batches: Sequence[str], layers: Mapping[str, Sequence[str]]
) -> list[ParseResult]:
    """Every `/gpuci` command in a comment, in order, each parsed or explained.

    Fenced code blocks (``` and ~~~), inline code, quoted lines (`>`) and HTML comments are
    removed first, so quoting or showing a command never runs it. A command is a line that
    starts (after optional whitespace) with `/gpuci`, case-insensitively. At most MAX_COMMANDS
    are read; one more entry, an error, says the rest were ignored. Never raises.
    """
    results: list[ParseResult] = []
    for line in _command_lines(body[:MAX_BODY]):
        if len(results) == MAX_COMMANDS:
            results.append(
                CommandError(
                    line, f"At most {MAX_COMMANDS} commands per comment: the rest were ignored."
                )
            )
            break
        results.append(_parse_line(line, valid_batches, layers))
    return results


def help_text(valid_batches: Sequence[str], layers: Mapping[str, Sequence[str]]) -> str:
    """Markdown: the commands, the batches, the layers, and who may use them."""
    parts = ["**gpuci commands** (need write access to this repository)", "", USAGE, ""]
    parts.append(f"Batches: {_code_list(valid_batches) or '(none configured)'}")
    if layers:
        lines = [f"- `{name}`: {_code_list(layers[name])}" for name in natural_sorted(layers)]
        parts += ["", "Layers:", *lines]
    return "\n".join(parts)


def natural_sorted(names: Iterable[str]) -> list[str]:
    """Names in human order: "2" < "4a" < "10" < "b"."""
    return sorted(names, key=_natural_key)


def command_runs_allowed(
    recent_run_timestamps: Sequence[float], now: float, limit: int = 20, window_s: int = 3600
) -> bool:
    """Whether one more command-triggered run may start on a PR: fewer than `limit` started
    in the last `window_s` seconds (timestamps in the future count, failing closed)."""
    since = now - window_s
    return sum(1 for t in recent_run_timestamps if t > since) < limit


# --- stripping -------------------------------------------------------------------------------

_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")  # any indent: stripping too much is the safe side
_INLINE_CODE = re.compile(r"(`+).*?\1")
_COMMAND_START = re.compile(r"^\s*/gpuci(?:\s|$)", re.IGNORECASE)


def _command_lines(body: str) -> Iterable[str]:
    """Lines outside code, quotes and HTML comments that start with `/gpuci`, stripped."""
    text = _HTML_COMMENT.sub("", body.replace("\r\n", "\n").replace("\r", "\n"))
    fence: str | None = None
    for raw in text.split("\n"):
        if fence is not None:
            if _closes(fence, raw):
                fence = None
            continue
        opening = _FENCE.match(raw)
        if opening:
            fence = opening.group(1)
            continue
        if raw.lstrip().startswith(">"):
            continue
        line = _INLINE_CODE.sub("", raw)
        if _COMMAND_START.match(line):
            yield line.strip()


def _closes(fence: str, line: str) -> bool:
    """A closing fence: the opening's character, at least as many, nothing else on the line."""
    marks = line.strip()
    return len(marks) >= len(fence) and marks == fence[0] * len(marks)


# --- grammar ---------------------------------------------------------------------------------

_SIMPLE = {
    ("cancel",): CommandKind.CANCEL,
    ("status",): CommandKind.STATUS,
    ("help",): CommandKind.HELP,
    ("rerun", "failed"): CommandKind.RERUN_FAILED,
    ("run", "all"): CommandKind.RUN_ALL,
}
_SHA_PREFIX = re.compile(rf"[0-9a-f]{{{MIN_SHA_PREFIX},40}}")


def _parse_line(
    line: str, valid_batches: Sequence[str], layers: Mapping[str, Sequence[str]]
) -> ParseResult:
    if len(line) > MAX_LINE:
        return CommandError(line[:80] + "...", f"Command line longer than {MAX_LINE} characters.")
    words = line.replace(",", " ").split()[1:]
    lowered = tuple(w.lower() for w in words)
    kind = _SIMPLE.get(lowered)
    if kind is CommandKind.RUN_ALL:
        return Command(kind, tuple(natural_sorted(set(valid_batches))), line=line)
    if kind is not None:
        return Command(kind, line=line)
    if lowered[:2] in {("run", "batch"), ("run", "batches")} and len(words) > 2:
        return _run_batches(line, words[2:], valid_batches)
    if lowered[:2] == ("run", "layer") and len(words) == 3:
        return _run_layer(line, words[2], layers)
    if lowered[:1] == ("approve",) and len(words) <= 2:
        return _approve(line, words[1:])
    what = (
        f"Unknown command `{_clip(line, 80)}`." if words else "A command is missing after `/gpuci`."
    )
    return CommandError(line, f"{what} Usage:\n\n{USAGE}")


def _run_batches(line: str, names: list[str], valid_batches: Sequence[str]) -> ParseResult:
    wanted = set(names)
    if len(wanted) > MAX_BATCHES:
        return CommandError(line, f"At most {MAX_BATCHES} batches per command.")
    unknown = natural_sorted(wanted - set(valid_batches))
    if unknown:
        which = "batch" if len(unknown) == 1 else "batches"
        return CommandError(
            line,
            f"Unknown {which} {_code_list(unknown)}. "
            f"Valid batches: {_code_list(valid_batches) or '(none configured)'}.",
        )
    return Command(CommandKind.RUN_BATCHES, tuple(natural_sorted(wanted)), line=line)


def _run_layer(line: str, name: str, layers: Mapping[str, Sequence[str]]) -> ParseResult:
    if name not in layers:
        valid = _code_list(layers) or "(none configured)"
        return CommandError(line, f"Unknown layer `{_clip(name)}`. Valid layers: {valid}.")
    batches = tuple(natural_sorted(set(layers[name])))
    return Command(CommandKind.RUN_LAYER, batches, layer=name, line=line)


def _approve(line: str, args: list[str]) -> ParseResult:
    if not args:
        return Command(CommandKind.APPROVE, line=line)
    sha = args[0].lower()
    if not _SHA_PREFIX.fullmatch(sha):
        return CommandError(
            line,
            f"`/gpuci approve` takes an optional commit SHA (at least {MIN_SHA_PREFIX} hex "
            f"characters), not `{_clip(args[0])}`.",
        )
    return Command(CommandKind.APPROVE, sha=sha, line=line)


def _code_list(names: Iterable[str]) -> str:
    return ", ".join(f"`{_clip(n)}`" for n in natural_sorted(set(names)))


def _clip(text: str, limit: int = 40) -> str:
    """User text echoed in a reply: short, and unable to close the surrounding code span."""
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple(
        (0, int(part)) if part[0] in "0123456789" else (1, part.lower())
        for part in re.split(r"([0-9]+)", name)
        if part
    )
