"""Request logs without credentials: the dashboard's `?token=`, bearer headers and cookies are
redacted in every request line gunicorn (or Werkzeug's development server) writes.

gunicorn's access log formats a dict of "atoms" (the request line, the query string, each
header and environ variable); `Redacting` rewrites them before any handler sees the record,
whatever `--access-logformat` asks for. `create_app` installs it on the loggers that write
request lines, so every way of serving the app (Procfile, systemd unit, a command line of
one's own) logs the same."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from contract.redact import REDACTED, redact_query, redact_text

REQUEST_LOGGERS = ("gunicorn.access", "werkzeug")
# Header atoms that are credentials whole (gunicorn names them "{name}i" / "{name}o").
HIDDEN_ATOMS = frozenset(
    {
        "{authorization}i", "{proxy-authorization}i", "{cookie}i", "{set-cookie}o",
        "{http_authorization}e", "{http_proxy_authorization}e", "{http_cookie}e",
    }
)  # fmt: skip
QUERY_ATOMS = frozenset({"q", "{query_string}e"})  # query strings without their "?"


class Redacting(logging.Filter):
    """Redacts credentials in a request log record's arguments (and its message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_text(record.msg)
        if isinstance(record.args, MutableMapping):
            for name, value in list(record.args.items()):
                record.args[name] = _atom(name, value)
        elif isinstance(record.args, tuple):
            record.args = tuple(redact_text(a) if isinstance(a, str) else a for a in record.args)
        return True


def _atom(name: Any, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if name in HIDDEN_ATOMS and value not in ("", "-"):
        return REDACTED
    if name in QUERY_ATOMS:
        return redact_query(value)
    return redact_text(value)


def install() -> None:
    """Put `Redacting` on the request loggers, once per process."""
    for name in REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Redacting) for f in logger.filters):
            logger.addFilter(Redacting())
