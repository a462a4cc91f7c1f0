"""Skips caused by a tool this machine lacks are repeated loudly at the end of the run: the tests
they stand for did not run, and the line says how to install what is missing."""

from __future__ import annotations

from typing import Any

import pytest

# Skip reasons start with this when a test cannot run for want of a host tool; the rest of the
# reason names the tool and how to get it.
MISSING = "missing tool:"


def skip_missing(reason: str) -> None:
    """Skip the running test because `reason` (a tool and how to install it) is missing."""
    pytest.skip(f"{MISSING} {reason}")


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_unconfigure(config: pytest.Config) -> None:
    """After pytest's own last line, so that it is the last thing `make test` prints."""
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if terminalreporter is None:
        return
    missing = [r for r in terminalreporter.stats.get("skipped", []) if MISSING in _reason(r)]
    if not missing:
        return
    terminalreporter.write_sep(
        "!", f"NOT TESTED: {len(missing)} test(s) skipped for a missing tool", red=True, bold=True
    )
    for report in missing:
        reason = _reason(report).split(MISSING, 1)[1].strip()
        terminalreporter.write_line(f"{report.nodeid}: {reason}", red=True)
    terminalreporter.write_line("Install it and run `make test` again (README: Quick start).")
