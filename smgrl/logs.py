"""Logging: human lines by default, one JSON object per line with ``--log-json``.

Structured fields travel in ``extra={"fields": {...}}`` so both formats show the same facts. No
caller ever passes a secret here; ``redact`` exists for values that might embed one (URLs with
userinfo).
"""

from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {}
        tail = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<5} {record.name}: {record.getMessage()}"
        if tail:
            line = f"{line} {tail}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "target": record.name,
            "message": record.getMessage(),
        }
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def _text(value) -> str:
    # Values are logged raw (SMG logs a selector containing a newline raw too); quote when needed.
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def configure(level: str = "info", json_lines: bool = False, stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Json() if json_lines else _Text())
    root = logging.getLogger("smgrl")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": fields})
