"""Logging: human lines by default, one JSON object per line with ``--log-json``.

Structured fields travel in ``extra={"fields": {...}}`` so both formats show the same facts. No
caller ever passes a secret here; ``redact`` exists for values that might embed one (URLs with
userinfo).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
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
        trace = _trace(self, record)
        if trace:
            line = f"{line}\n{trace}"
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
        trace = _trace(self, record)
        if trace:
            out["exception"] = trace
        return json.dumps(out, ensure_ascii=False, default=str)


def _trace(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The traceback: rendered before the record crossed to the writer thread (exc_text), or now."""
    if record.exc_info:
        return formatter.formatException(record.exc_info)
    return record.exc_text or None


def _text(value) -> str:
    # Values are logged raw (SMG logs a selector containing a newline raw too); quote when needed.
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


class _Enqueue(logging.handlers.QueueHandler):
    """Hands records to the writer thread as they are: formatting and the write happen there.

    The stock ``QueueHandler.prepare`` formats the message in the caller's thread; our records
    carry their facts in ``fields`` and are formatted by the listener's handler instead, so the
    request path pays only for the LogRecord and a queue put (one ``rl.proxy`` line per engine
    in a fan-out made logging a measurable share of its CPU)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if record.exc_info:
            # Tracebacks cannot cross threads safely as objects: render them now (rare path).
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


_listener: logging.handlers.QueueListener | None = None


def configure(level: str = "info", json_lines: bool = False, stream=None) -> None:
    """Log lines go through a queue to one writer thread (started here, stopped by ``shutdown``)."""
    global _listener
    shutdown()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Json() if json_lines else _Text())
    records: queue.SimpleQueue = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, handler)
    _listener.start()
    root = logging.getLogger("smgrl")
    root.handlers[:] = [_Enqueue(records)]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False


def shutdown() -> None:
    """Write every queued line and stop the writer thread (idempotent)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": fields})
