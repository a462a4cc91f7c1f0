"""`/gpuci` comment grammar: commands, what is stripped, errors, help, limits, the rate rule."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands import (
    MAX_BATCHES,
    MAX_COMMANDS,
    MAX_LINE,
    Command,
    CommandError,
    CommandKind,
    command_runs_allowed,
    help_text,
    natural_sorted,
    parse_comment,
)

BATCHES = ("2", "4a", "5", "10", "11")
LAYERS = {"2": ("2", "5"), "3": BATCHES}
K = CommandKind


def parse(body: str) -> list[Command | CommandError]:
    return parse_comment(body, BATCHES, LAYERS)


def kinds(body: str) -> list[CommandKind | str]:
    return [r.kind if isinstance(r, Command) else "error" for r in parse(body)]


@pytest.mark.parametrize(
    ("body", "kind", "batches"),
    [
        ("/gpuci run batch 10", K.RUN_BATCHES, ("10",)),
        ("/gpuci run batch 10 4a 2", K.RUN_BATCHES, ("2", "4a", "10")),
        ("/gpuci run batch 2, 5,10", K.RUN_BATCHES, ("2", "5", "10")),
        ("/gpuci run batch 2 2 2", K.RUN_BATCHES, ("2",)),
        ("/gpuci run batches 11", K.RUN_BATCHES, ("11",)),
        ("/GPUCI RUN BATCH 4a", K.RUN_BATCHES, ("4a",)),
        ("   /gpuci   run   batch   5  ", K.RUN_BATCHES, ("5",)),
        ("\t/gpuci run batch 5", K.RUN_BATCHES, ("5",)),
        ("/gpuci run layer 2", K.RUN_LAYER, ("2", "5")),
        ("/gpuci run layer 3", K.RUN_LAYER, ("2", "4a", "5", "10", "11")),
        ("/gpuci run all", K.RUN_ALL, ("2", "4a", "5", "10", "11")),
        ("/gpuci Run All", K.RUN_ALL, ("2", "4a", "5", "10", "11")),
        ("/gpuci rerun failed", K.RERUN_FAILED, ()),
        ("/gpuci cancel", K.CANCEL, ()),
        ("/gpuci approve", K.APPROVE, ()),
        ("/gpuci status", K.STATUS, ()),
        ("/gpuci help", K.HELP, ()),
        ("/gpuci HELP", K.HELP, ()),
        ("Thanks, looks good.\n\n/gpuci cancel\nbye", K.CANCEL, ()),
    ],
)
def test_command_grammar(body: str, kind: CommandKind, batches: tuple[str, ...]) -> None:
    [command] = parse(body)
    assert isinstance(command, Command)
    assert (command.kind, command.batches) == (kind, batches)


@pytest.mark.parametrize(
    ("body", "sha"),
    [
        ("/gpuci approve", None),
        ("/gpuci approve abcdef1", "abcdef1"),
        ("/gpuci approve ABCDEF1234", "abcdef1234"),
        ("/gpuci approve " + "a" * 40, "a" * 40),
    ],
)
def test_approve_takes_an_optional_sha(body: str, sha: str | None) -> None:
    [command] = parse(body)
    assert isinstance(command, Command)
    assert (command.kind, command.sha) == (K.APPROVE, sha)


@pytest.mark.parametrize(
    "body",
    [
        "please /gpuci run all",  # not at the start of the line
        "/gpucirun all",
        "/gpuci-bot run all",
        "gpuci run all",
        "no commands here",
        "",
    ],
)
def test_text_that_is_not_a_command(body: str) -> None:
    assert parse(body) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("```\n/gpuci run all\n```", []),
        ("```bash\n/gpuci run all\n```\n", []),
        ("~~~\n/gpuci run all\n~~~", []),
        ("  ```\n/gpuci run all\n  ```", []),
        ("````md\n```\n/gpuci run all\n````", []),  # a shorter fence does not close
        ("~~~\n```\n/gpuci run all\n```\n~~~", []),  # nor one of the other kind
        ("```\n/gpuci run all", []),  # unterminated: to the end
        ("```\nx\n```\n/gpuci cancel", [K.CANCEL]),
        ("> /gpuci run all", []),
        ("  > /gpuci run all", []),
        (">> /gpuci run all\n/gpuci status", [K.STATUS]),
        ("`/gpuci run all`", []),
        ("`` /gpuci run all ``", []),
        ("<!-- /gpuci run all -->", []),
        ("<!--\n/gpuci run all\n-->\n/gpuci status", [K.STATUS]),
        ("<!-- unterminated\n/gpuci run all", []),
        ("hi\r\n/gpuci status\r\n", [K.STATUS]),
        ("/gpuci cancel\n/gpuci run batch 2", [K.CANCEL, K.RUN_BATCHES]),
    ],
)
def test_code_quotes_and_comments_are_stripped(body: str, expected: list[CommandKind]) -> None:
    assert kinds(body) == expected


@pytest.mark.parametrize(
    ("body", "must_say"),
    [
        ("/gpuci run batch 99", ["`99`", "Valid batches: `2`, `4a`, `5`, `10`, `11`"]),
        ("/gpuci run batch 2 x y", ["batches `x`, `y`", "Valid batches: `2`, `4a`"]),
        ("/gpuci run layer 9", ["`9`", "Valid layers: `2`, `3`"]),
        ("/gpuci frobnicate", ["Unknown command", "/gpuci run batch", "/gpuci help"]),
        ("/gpuci", ["missing", "/gpuci run layer", "/gpuci rerun failed"]),
        ("/gpuci run batch", ["Usage", "/gpuci run all"]),
        ("/gpuci run layer", ["Usage"]),
        ("/gpuci run layer 2 3", ["Usage"]),
        ("/gpuci cancel now", ["Usage", "/gpuci cancel"]),
        ("/gpuci rerun", ["Usage"]),
        ("/gpuci approve main", ["optional commit SHA", "`main`"]),
        ("/gpuci approve abc", ["at least 7"]),
        ("/gpuci run batch `10`", ["Usage"]),  # inline code is stripped from commands too
    ],
)
def test_errors_say_what_is_valid(body: str, must_say: list[str]) -> None:
    [error] = parse(body)
    assert isinstance(error, CommandError)
    for text in must_say:
        assert text in error.message


def test_unknown_names_cannot_break_out_of_code_spans() -> None:
    [error] = parse("/gpuci run batch x`@everyone")  # one backtick: not inline code
    assert isinstance(error, CommandError)
    assert "`x'@everyone`" in error.message


def test_no_batches_or_layers_configured() -> None:
    [batch_error, layer_error] = parse_comment("/gpuci run batch 1\n/gpuci run layer 2", [], {})
    assert isinstance(batch_error, CommandError)
    assert isinstance(layer_error, CommandError)
    assert "(none configured)" in batch_error.message
    assert "(none configured)" in layer_error.message


def test_at_most_ten_commands_per_comment() -> None:
    results = parse("\n".join(["/gpuci status"] * (MAX_COMMANDS + 5)))
    assert [r.kind for r in results[:-1] if isinstance(r, Command)] == [K.STATUS] * MAX_COMMANDS
    assert isinstance(results[-1], CommandError)
    assert f"At most {MAX_COMMANDS} commands" in results[-1].message


@pytest.mark.parametrize(("count", "ok"), [(MAX_BATCHES, True), (MAX_BATCHES + 1, False)])
def test_at_most_twenty_batches_per_command(count: int, ok: bool) -> None:
    names = [str(i) for i in range(count)]
    [result] = parse_comment("/gpuci run batch " + " ".join(names), names, {})
    assert isinstance(result, Command) is ok
    if not ok:
        assert isinstance(result, CommandError)
        assert f"At most {MAX_BATCHES} batches" in result.message


def test_overlong_line_is_refused() -> None:
    [result] = parse("/gpuci run batch " + "2 " * MAX_LINE)
    assert isinstance(result, CommandError)
    assert f"longer than {MAX_LINE}" in result.message


def test_help_lists_commands_batches_and_layers() -> None:
    text = help_text(["10", "2", "4a"], {"3": ["10", "2"], "2": ["2"]})
    for usage in (
        "/gpuci run batch",
        "/gpuci run layer",
        "/gpuci run all",
        "/gpuci rerun failed",
        "/gpuci cancel",
        "/gpuci approve",
        "/gpuci status",
        "/gpuci help",
    ):
        assert usage in text
    assert "Batches: `2`, `4a`, `10`" in text
    assert "- `2`: `2`\n- `3`: `2`, `10`" in text
    assert "write access" in text


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["10", "2", "4a", "4", "1"], ["1", "2", "4", "4a", "10"]),
        (["b", "a10", "a9", "A1"], ["A1", "a9", "a10", "b"]),
        (["gemini", "11", "2"], ["2", "11", "gemini"]),
        ([], []),
    ],
)
def test_natural_sort(names: list[str], expected: list[str]) -> None:
    assert natural_sorted(names) == expected


NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("timestamps", "limit", "allowed"),
    [
        ([], 20, True),
        ([NOW - 10] * 19, 20, True),
        ([NOW - 10] * 20, 20, False),
        ([NOW - 3601] * 50, 20, True),  # outside the window
        ([NOW - 3599] * 2, 2, False),
        ([NOW + 60] * 2, 2, False),  # clock skew: future runs still count
        ([NOW - 10], 0, False),
    ],
)
def test_command_rate_limit(timestamps: list[float], limit: int, allowed: bool) -> None:
    assert command_runs_allowed(timestamps, NOW, limit=limit) is allowed


_TOKENS = st.sampled_from(
    ["/gpuci", "/GPUCI", "run", "batch", "layer", "all", "rerun", "failed", "approve", "2", "4a",
     "```", "~~~", ">", "`", "<!--", "-->", ",", " ", "\n", "\r\n", "\t", "@x", "\x00", "é"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(st.one_of(_TOKENS, st.text(max_size=5))).map("".join)))
def test_parse_never_raises(body: str) -> None:
    results = parse(body)
    assert len(results) <= MAX_COMMANDS + 1
    assert all(isinstance(r, Command | CommandError) for r in results)


def test_module_is_pure() -> None:
    """Importing the grammar pulls in no web, Redis, GitHub or process machinery."""
    code = (
        "import sys, bot.commands;"
        "bad = {'flask', 'redis', 'rq', 'github', 'subprocess', 'requests'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
