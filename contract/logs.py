"""Log lines of the gpuci processes: `key=value` pairs in text, or one JSON object a line."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

# Messages carry their context as key=value (delivery=..., run=..., repo=..., sha=...).
_PAIR = re.compile(r"\b(delivery|run|repo|pr|sha|batch|host|gpus|event|action|check_run)=(\S+)")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the context pairs."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
            **dict(_PAIR.findall(message)),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(log_format: str = "text") -> None:
    """gpuci's loggers to stderr at INFO, as text or JSON (`GPUCI_LOG_FORMAT`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logger = logging.getLogger("gpuci")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
