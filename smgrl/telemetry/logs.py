"""Logging: human lines by default, one JSON object per line with ``--log-json``.

Structured fields travel in ``extra={"fields": {...}}`` so both formats show the same facts. No
caller ever passes a secret here (worker URLs with userinfo are refused at registration).

Values often come from outside (a client's ``x-request-id``, a path, an engine's answer), so
every line is escaped here, in the formatters, whoever built the record: control characters (C0,
DEL, C1 such as ``\x85``), Unicode line and paragraph separators, bidi overrides and lone
surrogates never reach the log raw. In the text format a field value is quoted (logfmt style)
when it is empty or holds a space, ``=``, ``"``, ``\\`` or an escaped character, so a value can
never add a field or a line; traceback lines are indented, so no line of one can pass for a log
line. The JSON format escapes the same characters as ``\\uXXXX``.
"""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
import queue
import stat
import sys
import time

from smgrl.core import escape, escape_for_json

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


# A text-format value is quoted when it holds one of these, anything unprintable, or nothing.
_QUOTED = (" ", "=", '"', "\\")


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {}
        # Keys are the callers' keyword names (code, never input); values are escaped.
        tail = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        message = escape(record.getMessage())
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<5} {record.name}: {message}"
        if tail:
            line = f"{line} {tail}"
        trace = _trace(self, record)
        if trace:
            # Each traceback line escaped and indented: an exception message quoting a client's
            # input cannot start a line of its own.
            line += "".join(f"\n    {escape(part)}" for part in trace.split("\n"))
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
        # json escapes C0 controls, quotes and backslashes; the rest of the unsafe set (DEL, C1,
        # separators, bidi, surrogates) can only occur inside strings, where \uXXXX is valid.
        return escape_for_json(json.dumps(out, ensure_ascii=False, default=str))


def _trace(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The traceback: rendered before the record crossed to the writer thread (exc_text), or now."""
    if record.exc_info:
        return formatter.formatException(record.exc_info)
    return record.exc_text or None


def _text(value) -> str:
    """A field value: bare when it is plain, else quoted with ``\\`` and ``"`` escaped too."""
    text = str(value)
    # Fast path (most values: ids, paths, numbers): str.isprintable() is False for every
    # character of the unsafe set (C0, DEL, C1, separators, bidi controls, surrogates).
    if text and text.isprintable() and not any(ch in text for ch in _QUOTED):
        return text
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


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
# The "smgrl" logger as it was before ``configure`` (handlers, level, propagate): ``shutdown``
# puts it back, so a process (or a test) that configured logging once leaves no queue handler
# behind for the next user of the logger (pytest's caplog, another configure).
_before: tuple | None = None


def on_regular_file(stream) -> bool:
    """True when ``stream`` writes to a regular file: a write then lands in the page cache and
    never waits for a reader (a pipe or a terminal can make a writer wait indefinitely)."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def configure(level: str = "info", json_lines: bool = False, stream=None) -> None:
    """Where lines go: written by the logging thread itself when ``stream`` is a regular file,
    else through a queue to one writer thread (started here, stopped by ``shutdown``).

    A write to a regular file cannot block on a reader, like the journal's inline commits on the
    event loop (journal/writer.py), so the line is formatted and written where it was logged: no
    queue put and no thread wake per line. Measured on 8-engine fan-outs (docs/benchmarks.md,
    "fan-out (control plane)"), the wake was the largest logging cost. A pipe or a terminal may
    stall a writer whenever its reader lags: the event loop must never wait on one, so those
    keep the writer thread."""
    global _listener, _before
    shutdown()
    stream = stream or sys.stderr
    root = logging.getLogger("smgrl")
    _before = (list(root.handlers), root.level, root.propagate, _record_extras())
    # Neither format prints a thread, process or multiprocessing name: a LogRecord that does not
    # look them up is cheaper (the stdlib's documented switches; shutdown() restores them).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Json() if json_lines else _Text())
    if on_regular_file(stream):
        root.handlers[:] = [handler]
    else:
        records: queue.SimpleQueue = queue.SimpleQueue()
        _listener = logging.handlers.QueueListener(records, handler)
        _listener.start()
        root.handlers[:] = [_Enqueue(records)]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False


def shutdown() -> None:
    """Write every queued line, stop the writer thread and give the logger back (idempotent)."""
    global _listener, _before
    if _listener is not None:
        _listener.stop()
        _listener = None
    if _before is not None:
        root = logging.getLogger("smgrl")
        root.handlers[:], level, root.propagate, extras = _before
        root.setLevel(level)
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = extras
        _before = None


def _record_extras() -> tuple[bool, bool, bool]:
    return logging.logThreads, logging.logProcesses, logging.logMultiprocessing


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields) -> None:
    if logger.isEnabledFor(level):
        # The record built here: Logger.log would also walk the stack for the caller's file and
        # line, which no format of ours prints (about a tenth of a line's cost).
        logger.handle(
            logger.makeRecord(logger.name, level, "", 0, message, (), None, extra={"fields": fields})
        )
