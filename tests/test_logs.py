"""Log lines carry delivery, run, repo and SHA; `GPUCI_LOG_FORMAT=json` makes them fields."""

from __future__ import annotations

import json
import logging

from contract.logs import JsonFormatter


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("gpuci.worker", logging.INFO, __file__, 1, message, args, None)


def test_json_lines_carry_the_context_as_fields() -> None:
    line = JsonFormatter().format(
        record("run=%s repo=%s sha=%s finished: %s", "17", "acme/sample", "a" * 40, "success")
    )
    entry = json.loads(line)
    assert entry["run"] == "17"
    assert entry["repo"] == "acme/sample"
    assert entry["sha"] == "a" * 40
    assert entry["level"] == "INFO"
    assert entry["message"].endswith("finished: success")


def test_json_lines_keep_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord("gpuci", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in entry["exception"]
    assert "run" not in entry  # no context in the message, no context fields
