"""Human tables and one-line event summaries (strings in, strings out, under the table settings
of the running command), and the terminal guard every ``smgrl journal`` command writes through.

Tables read well in a terminal: every UUID in a cell is shortened to the shortest
prefix, at least 8 characters, that tells apart every id shown so far (as git abbreviates
hashes; every command that takes an id accepts such a prefix), times lose their year, seconds
fraction and ``Z`` when the full form does not fit, and the widest columns are cut with an
ellipsis until a line fits the terminal (``COLUMNS`` / ``--width``; 120 when there is no
terminal). ``--wide`` (and ``--json``) show everything in full.

Nothing a client or an engine wrote reaches the terminal raw: cells escape control
characters (``\\n``, ``\\x1b``, ``\\x85``, ...) and ``SafeOutput`` escapes whatever else a
command prints, so an OSC, BEL or CR sequence in a selector, request id or engine answer is
shown, never executed.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import json
import operator
import re
import shutil
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from smgrl.core import escape, escape_for_json, escape_lines

__all__ = [
    "Abbrev",
    "ChunkedTable",
    "EventsLayout",
    "FixedTable",
    "SafeOutput",
    "chunks",
    "fit",
    "json_text",
    "output",
    "short_id",
    "summarize",
    "table",
]

# Fields never shown in a one-line summary: long or already in other columns.
_HIDDEN = frozenset({"body", "body_sha256", "excerpt", "targets", "config", "intent", "labels"})
_MAX_CELL = 60


def json_text(obj: Any, *, lines: bool = False) -> str:
    """JSON for scripts: one compact line per object (``lines``), else an indented document."""
    if lines:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=False)
    return json.dumps(obj, indent=2, ensure_ascii=False)


UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_ISO = re.compile(r"^\d{4}-(\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}Z$")
MIN_ID = 8  # as git's 7, plus one: UUIDv7 ids made in one second share more
MIN_COLUMN = 5  # "50 ms", "ok", a cut header: below this a column says nothing
DEFAULT_WIDTH = 120
MIN_WIDTH = 60


@attrs.define
class Settings:
    """How this invocation prints tables: ``width`` None = no limit; ``wide`` = full ids too."""

    width: int | None = DEFAULT_WIDTH
    wide: bool = False


_settings = Settings()


def current() -> Settings:
    """The table settings of the running command."""
    return _settings


def terminal_width(option: int | None) -> int:
    """``--width``, else ``COLUMNS`` / the terminal's width (at least 60, the narrowest the
    events table fits), else 120 (output to a pipe)."""
    if option is not None:
        return option
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


@contextlib.contextmanager
def output(width: int | None, wide: bool) -> Iterator[Settings]:
    """Table settings for one command (the journal group sets them from its options)."""
    global _settings
    before = _settings
    _settings = Settings(None if wide else width, wide)
    try:
        yield _settings
    finally:
        _settings = before


class Abbrev:
    """Shortest unique prefixes of the ids shown in one output, one length for all. Output that
    comes in chunks adds each chunk's ids before printing it: the length only grows, so the ids
    of a chunk share one length, and an id printed in an earlier chunk was unique among the ids
    seen up to then."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self.seen: set[str] = set()
        self._sorted: list[str] = []
        self.length = MIN_ID
        self.add(ids)

    def add(self, ids: Iterable[str]) -> None:
        for new in {i.lower() for i in ids} - self.seen:
            # Only the sorted neighbours of a new id can share a longer prefix with it.
            at = bisect.bisect(self._sorted, new)
            for other in self._sorted[max(0, at - 1) : at + 1]:
                self.length = max(self.length, min(36, _common(new, other) + 1))
            self._sorted.insert(at, new)
            self.seen.add(new)

    def text(self, text: str) -> str:
        """Every UUID in ``text`` shortened (``add`` them first)."""
        return UUID.sub(lambda m: m.group()[: self.length], text)


def _common(a: str, b: str) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


_TEXT_ONLY = frozenset({str, type(None)})
_INT_ONLY = frozenset({int, type(None)})


def ids_in(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """Every UUID in these cells (in no particular order: ``Abbrev.add`` takes them as a set)."""
    return _ids_in_columns([_values(rows, c) for c in columns])


def _values(rows: Sequence[Mapping[str, Any]], column: str) -> list[Any]:
    """``row.get(column)`` of every row (in C when every row has it)."""
    try:
        return list(map(operator.itemgetter(column), rows))
    except KeyError:
        return [r.get(column) for r in rows]


def _ids_in_columns(columns: Iterable[list[Any]]) -> list[str]:
    found: list[str] = []
    for values in columns:
        if _TEXT_ONLY.issuperset(map(type, values)):
            # A UUID is 36 long: a column of shorter text holds none. Else one regex pass over its
            # cells joined by a newline, which no UUID can span (a million cells at --all).
            if max(map(len, filter(None, values)), default=0) >= 36:
                found += UUID.findall("\n".join(filter(None, values)))
            continue
        if _INT_ONLY.issuperset(map(type, values)):
            continue  # an integer's text has no hyphen but a sign: no UUID (refits' cycle column)
        # A UUID is 36 long: shorter strings are skipped without a regex (and without str() of them).
        texts = (t for v in values if v and (len(t := v if type(v) is str else str(v)) >= 36))
        found += [m.group() for t in texts for m in UUID.finditer(t)]
    return found


def _cell(value: Any, limit: int | None = None) -> str:
    text = "-" if value is None or value == "" else escape(str(value))
    return _cut(text, limit)


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    if "://" in text[:8] and limit > 1:
        return "…" + text[len(text) - limit + 1 :]  # a URL's host and port say more than its scheme
    return text[: max(0, limit - 1)] + "…"


def _compact_time(text: str) -> str:
    match = _ISO.match(text)
    return match.group(1).replace("T", " ") if match else text


def _fit(natural: list[int], values: list[int], floors: list[int], width: int, gap: int) -> list[int]:
    """Column widths summing (with their gaps) to at most ``width``: headers longer than their
    values are cut first (a cut header loses less than a cut value), then the widest column
    loses a character at a time, none below its floor."""
    widths = list(natural)
    gaps = gap * (len(widths) - 1)
    for i in sorted(range(len(widths)), key=lambda i: values[i] - natural[i]):
        excess = sum(widths) + gaps - width
        if excess <= 0:
            break
        widths[i] -= min(excess, max(0, widths[i] - max(values[i], floors[i])))
    while sum(widths) + gaps > width:
        candidates = [i for i, w in enumerate(widths) if w > floors[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    limits: Mapping[str, int] | None = None,
    optional: Sequence[str] = (),
    whole: Sequence[str] = (),
) -> str:
    """A plain-text table with a header, fitted to the invocation's settings (module docstring);
    ``limits`` caps a column's width even when there is room. On a narrow terminal the
    ``optional`` columns are dropped, first listed first, before anything is cut; ``whole``
    columns (and ids, URLs, times, headers) are never cut: a line that still does not fit is
    left for the terminal to wrap."""
    layout, cells = fit(rows, columns, limits=limits, optional=optional, whole=whole)
    return layout.render(cells, header=True)


def fit(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    limits: Mapping[str, int] | None = None,
    abbrev: Abbrev | None = None,
    optional: Sequence[str] = (),
    whole: Sequence[str] = (),
) -> tuple[FixedTable, list[list[str]]]:
    """The layout ``table()`` prints ``rows`` with, and their cells (of the columns it keeps:
    ``layout.columns``). ``abbrev`` (else one of these rows' ids) shortens the ids."""
    wide = _settings.wide
    width = _settings.width
    if not wide and width is not None and optional:
        columns = _keep(rows, columns, limits or {}, abbrev, optional, whole, width)
    limits = {} if wide else (limits or {})
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if not wide:
        if abbrev is None:
            abbrev = Abbrev(ids_in(rows, columns))
        cells = [[abbrev.text(v) for v in row] for row in cells]
    cells = [
        [_cut(v, limits.get(c, _MAX_CELL) if not wide else None) for c, v in zip(columns, row)]
        for row in cells
    ]

    def natural(cells_: list[list[str]]) -> list[int]:
        return [max([len(c), *(len(row[i]) for row in cells_)]) for i, c in enumerate(columns)]

    widths = natural(cells)
    if width is not None and sum(widths) + 2 * (len(widths) - 1) > width:
        cells = [[_compact_time(v) for v in row] for row in cells]
        widths = natural(cells)
        values = [max([0, *(len(row[i]) for row in cells)]) for i in range(len(columns))]
        # Tables that name their optional or whole columns keep their headers and URLs whole too.
        strict = bool(optional or whole)
        floors = [
            w if c in whole else min(w, _floor(cells, i, c if strict else "", urls=strict))
            for i, (c, w) in enumerate(zip(columns, widths, strict=True))
        ]
        # Many narrow columns (refits): one space between them rather than cut every one.
        gap = 2 if sum(floors) + 2 * (len(floors) - 1) <= width else 1
        widths = _fit(widths, values, floors, width, gap)
        return FixedTable(columns, widths, gap, compact=True), cells
    return FixedTable(columns, widths), cells


# Cells never cut: (shortened) ids, which must stay typable, and times; in the tables that ask
# for it (``optional``/``whole``), URLs too (a cut one names another host or port).
_WHOLE = re.compile(
    r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{1,4}){0,3}(?:-[0-9a-fA-F]{1,12})?|"
    r"(?:\d{4}-)?\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{3}Z)?"
)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def _floor(cells: list[list[str]], index: int, header: str = "", *, urls: bool = False) -> int:
    """The narrowest a column may get: its whole cells (ids, times; URLs with ``urls``) and
    ``header`` (two cut headers could read the same)."""
    whole = [
        len(row[index])
        for row in cells
        if _WHOLE.fullmatch(row[index]) or (urls and _URL.fullmatch(row[index]))
    ]
    return max([MIN_COLUMN, len(header), *whole])


def _keep(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    limits: Mapping[str, int],
    abbrev: Abbrev | None,
    optional: Sequence[str],
    whole: Sequence[str],
    width: int,
) -> list[str]:
    """``columns`` without the optional ones (first listed, first dropped) a terminal of
    ``width`` has no room for: what is kept must fit without cutting below a column's floor."""
    ab = abbrev if abbrev is not None else Abbrev(ids_in(rows, columns))
    cells = [[_cut(ab.text(_cell(r.get(c))), limits.get(c, _MAX_CELL)) for c in columns] for r in rows]
    cells = [[_compact_time(v) for v in row] for row in cells]
    need = {}
    for i, c in enumerate(columns):
        natural = max([len(c), *(len(row[i]) for row in cells)])
        need[c] = natural if c in whole else min(natural, _floor(cells, i, c, urls=True))
    kept = list(columns)
    for c in optional:
        if sum(need[k] for k in kept) + 2 * (len(kept) - 1) <= width:
            break
        if c in kept:
            kept.remove(c)
    return kept


@attrs.frozen
class FixedTable:
    """Columns of fixed widths: the same widths for every chunk of one output."""

    columns: Sequence[str]
    widths: Sequence[int]
    gap: int = 2
    compact: bool = False  # times lose their year and fraction (the fitted table did)

    def line(self, values: Sequence[str]) -> str:
        # A width of 0 is the unbounded last column (--wide).
        parts = [(_cut(v, w).ljust(w) if w else v) for v, w in zip(values, self.widths, strict=True)]
        return (" " * self.gap).join(parts).rstrip()

    def render_fitting(self, cells: Iterable[Sequence[str]], *, header: bool) -> str:
        """``render`` of rows whose every cell fits its column (the caller checked): one format
        string per line, the same text as ``line`` (each cell padded to its width, the last one
        unbounded before the line's rstrip)."""
        lines = [self.line(self.columns)] if header else []
        widths = self.widths
        fmt = (" " * self.gap).join([f"{{:<{w}}}" if w else "{}" for w in widths[:-1]] + ["{}"]).format
        lines += [line.rstrip() for line in itertools.starmap(fmt, cells)]
        return "\n".join(lines)

    def render(self, cells: Sequence[Sequence[str]], *, header: bool) -> str:
        lines = [self.line(self.columns)] if header else []
        # ``line`` per row, inlined (a million cells at --all): a cell that fits is only padded.
        widths, sep = self.widths, " " * self.gap
        pairs = list(enumerate(widths))
        for row in cells:
            if len(row) != len(widths):
                raise ValueError("a row does not have one value per column")
            lines.append(
                sep.join(
                    [
                        (row[i].ljust(w) if len(row[i]) <= w else _cut(row[i], w).ljust(w)) if w else row[i]
                        for i, w in pairs
                    ]
                ).rstrip()
            )
        return "\n".join(lines)


def chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``rows`` in lists of ``size`` (the last may be shorter): streamed output, printed per chunk."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class ChunkedTable:
    """A table printed in chunks (output streamed, never held whole), with one ``Abbrev`` for the
    ids of the whole output. The first chunk is fitted like ``table()`` and later chunks keep that
    layout; a value wider than its column, in a column the fit did not narrow to the terminal,
    fits the layout again (on the widest values seen so far) and prints the header again, so no
    value is cut that the whole table would show. ``columns`` may change between chunks too (a
    refit phase seen for the first time): fitted again, with a header."""

    def __init__(
        self, limits: Mapping[str, int] | None = None, optional: Sequence[str] = (), whole: Sequence[str] = ()
    ) -> None:
        self.limits = limits
        self.optional, self.whole = tuple(optional), tuple(whole)
        self.asked: tuple[str, ...] = ()  # the columns asked for; the layout keeps some of them
        self.layout: FixedTable | None = None
        self.capped: list[bool] = []  # per column: the fit narrowed it below its values
        self.widest: dict[str, Mapping[str, Any]] = {}  # column -> the row with its longest cell
        self.abbrev = Abbrev()

    def render(self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
        columns = tuple(columns)
        wide = _settings.wide
        layout = self.layout
        same = layout is not None and self.asked == columns
        values = [_values(rows, c) for c in (layout.columns if same else columns)]
        if not wide:
            self.abbrev.add(_ids_in_columns(values))
        if same:
            cols = self._columns(values, tuple(layout.columns), layout.compact)
            widths, capped = layout.widths, self.capped
            # Column by column in C (map, max): a million cells at --all.
            longest = [max(map(len, column), default=0) for column in cols]
            if all(not w or most <= w for w, most in zip(widths, longest, strict=True)):
                return layout.render_fitting(zip(*cols), header=False)
            if all(capped[i] or not widths[i] or most <= widths[i] for i, most in enumerate(longest)):
                return layout.render([list(row) for row in zip(*cols)], header=False)
        self.asked = columns
        sample = [self.widest[c] for c in columns if c in self.widest]
        layout, cells = fit(
            [*sample, *rows],
            columns,
            limits=self.limits,
            abbrev=self.abbrev,
            optional=self.optional,
            whole=self.whole,
        )
        self.layout = layout
        columns = tuple(layout.columns)
        natural = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
        self.capped = [w < n for w, n in zip(layout.widths, natural, strict=True)]
        for i, c in enumerate(columns):
            longest = max(range(len(cells)), key=lambda k: len(cells[k][i]))
            self.widest[c] = ([*sample, *rows])[longest]
        return layout.render(cells[len(sample) :], header=True)

    def _columns(self, values: list[list[Any]], columns: tuple[str, ...], compact: bool) -> list[list[str]]:
        """The cells of each column as ``fit`` makes them (escaped, ids shortened, cut to their
        limits), from each column's values."""
        # Column by column (a million cells at --all): a column of printable non-empty text, or of
        # integers, is its own cells; anything else goes through _cell's rules per cell, inlined.
        cols = list(map(_column_cells, values))
        if not _settings.wide:
            limits = self.limits or {}
            text = self.abbrev.text
            for i, column in enumerate(cols):
                cap = limits.get(columns[i], _MAX_CELL)
                most = max(map(len, column), default=0)
                if most < 36 and most <= cap:
                    continue
                # Per cell only in the columns that need it: a cell as long as a UUID may hold
                # one, a cell longer than its cap is cut.
                out = []
                for v in column:
                    if len(v) >= 36:
                        v = _cut(text(v), cap) if len(v) > cap else text(v)
                    out.append(v if len(v) <= cap else _cut(v, cap))
                cols[i] = out
            if compact:
                # Only a cell of an ISO time's length (24) can be one.
                cols = [
                    [_compact_time(v) for v in column] if 24 in set(map(len, column)) else column
                    for column in cols
                ]
        return cols


def _column_cells(values: list[Any]) -> list[str]:
    """``_cell`` of each value of one column (escaped; None and "" shown as "-")."""
    kinds = set(map(type, values))
    if kinds == {str} and "" not in values and "".join(values).isprintable():
        return values
    if kinds == {int}:
        return list(map(str, values))
    return [
        "-"
        if v is None or v == ""
        else (t if (t := v if type(v) is str else str(v)).isprintable() else escape(t))
        for v in values
    ]


class EventsLayout:
    """The ``events`` table: ``seq time type summary`` fitted to the width (``stream`` too with
    ``--wide``); widths fixed up front, ids shortened consistently across chunks."""

    def __init__(self, head: int, types: Sequence[str]) -> None:
        self.wide = _settings.wide
        self.abbrev = Abbrev()
        seq = max(3, len(str(head)))
        kind = max([4, *map(len, types)])
        width = _settings.width
        self.short_time = width is not None and seq + 24 + kind + 6 + 40 > width
        time = 14 if self.short_time else 24
        if self.wide:
            self.table = FixedTable(("seq", "time", "stream", "type", "summary"), (seq, time, 43, kind, 0))
        else:
            summary = max(20, (width or DEFAULT_WIDTH) - (seq + time + kind + 6))
            self.table = FixedTable(("seq", "time", "type", "summary"), (seq, time, kind, summary))

    def render(self, rows: Sequence[Mapping[str, Any]], *, header: bool) -> str:
        columns = self.table.columns
        cells = [[_cell(r.get(c)) for c in columns] for r in rows]
        if not self.wide:
            self.abbrev.add(ids_in(rows, columns))
            cells = [[self.abbrev.text(v) for v in row] for row in cells]
        if self.short_time:
            cells = [[_compact_time(v) for v in row] for row in cells]
        return self.table.render(cells, header=header)


def notes(lines: Iterable[str]) -> str:
    """Lines under a table, indented and wrapped at the width (never inside a word: a URL or an
    id stays whole), for what a cell holds in full (a refit's failed engines)."""
    width = _settings.width or DEFAULT_WIDTH
    return "\n".join(
        textwrap.fill(
            escape(line),
            width,
            initial_indent="  ",
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for line in lines
    )


def short_id(value: str | None) -> str:
    return "-" if not value else value


class SafeOutput(io.TextIOBase):
    """A text stream that escapes control characters on their way to the terminal (newlines
    stay); in JSON mode as ``\\uXXXX``, which keeps the JSON valid. Installed as ``sys.stdout``
    and ``sys.stderr`` for the length of one ``smgrl journal`` command, so every command, present
    and future, prints through it."""

    def __init__(self, inner, as_json: Callable[[], bool]) -> None:
        super().__init__()
        self.inner = inner
        self.as_json = as_json

    def write(self, text: str) -> int:  # type: ignore[override]
        if not isinstance(text, str):
            raise TypeError("SafeOutput takes text")
        self.inner.write(escape_for_json(text) if self.as_json() else escape_lines(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")

    @property
    def errors(self):  # type: ignore[override]
        return getattr(self.inner, "errors", "strict")


def _kv(payload: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> str:
    parts = []
    for key, value in payload.items():
        if key in _HIDDEN or key in skip or value in (None, "", (), [], {}):
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        parts.append(f"{key}={value}")
    return " ".join(parts)


def summarize(type_: str, p: Any) -> str:
    """What an event says, in one line (never a body, an excerpt or anything secret-shaped)."""
    if not isinstance(p, dict):
        return "(undecodable payload)"
    if type_ == "control.started":
        targets = p.get("targets") or ()
        sel = f" selector={p['selector']}" if p.get("selector") else ""
        version = (p.get("intent") or {}).get("version")
        ver = f" version={version}" if version else ""
        who = f" by {p['principal']}" if p.get("principal") else ""
        return f"op {p.get('op_id')} {p.get('kind')} {p.get('method')} /{p.get('path', '').lstrip('/')}{sel}{ver} targets={len(targets)}{who}"
    if type_ == "control.outcome":
        what = f"HTTP {p.get('status')}" if p.get("error") is None else f"{p.get('error')}"
        return f"op {p.get('op_id')} worker {p.get('worker_id')} {what} in {p.get('latency_ms')} ms"
    if type_ == "control.finished":
        return (
            f"op {p.get('op_id')} {p.get('result')} HTTP {p.get('http_status')} "
            f"{p.get('succeeded')}/{p.get('total')} in {p.get('latency_ms')} ms"
        )
    if type_ == "control.interrupted":
        return (
            f"op {p.get('op_id')} interrupted ({p.get('reason')}): recorded "
            f"{len(p.get('recorded_targets') or ())}, missing {len(p.get('missing_targets') or ())}"
        )
    if type_ == "worker.registered":
        labels = p.get("labels") or {}
        lab = " labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) if labels else ""
        return f"worker {p.get('worker_id')} {p.get('url')} via {p.get('source')}{lab}"
    if type_.startswith("worker.") and "worker_id" in p:
        rest = _kv(p, frozenset({"worker_id"}))
        return f"worker {p['worker_id']} {rest}".rstrip()
    if type_ == "audit.control_plane":
        return (
            f"{p.get('principal')} {p.get('method')} {p.get('path')} -> {p.get('status')} {p.get('outcome')}"
        )
    return _kv(p)
