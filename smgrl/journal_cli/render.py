"""Human tables and one-line event summaries (pure: strings in, strings out)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["json_text", "short_id", "summarize", "table"]

# Fields never shown in a one-line summary: long or already in other columns.
_HIDDEN = frozenset({"body", "body_sha256", "excerpt", "targets", "config", "intent", "labels"})
_MAX_CELL = 60


def json_text(obj: Any, *, lines: bool = False) -> str:
    """JSON for scripts: one compact line per object (``lines``), else an indented document."""
    if lines:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=False)
    return json.dumps(obj, indent=2, ensure_ascii=False)


def _cell(value: Any, limit: int) -> str:
    text = "-" if value is None or value == "" else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, limits: Mapping[str, int] | None = None
) -> str:
    """A plain-text table with a header; cells longer than their limit are cut with an ellipsis."""
    limits = limits or {}
    cells = [[_cell(r.get(c), limits.get(c, _MAX_CELL)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def short_id(value: str | None) -> str:
    return "-" if not value else value


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
