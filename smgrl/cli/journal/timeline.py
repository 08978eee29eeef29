"""The refit picture (pure): SVG panels and a self-contained HTML report. No JS, no external assets.

Layout, top to bottom: a legend; an overview with one bar per cycle (height = duration, segments =
phase durations; failed cycles marked with a red triangle, open ones drawn hollow); then one panel
per cycle: a row per engine, its calls as bars on the cycle's own time axis, coloured by phase.
A failed call has a red outline and a cross; a call with no recorded outcome is hatched.
Every bar has a tooltip (SVG ``<title>``) with the operation id and what happened.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator, Sequence

from smgrl.history.values import fmt_ms, fmt_ts
from smgrl.state import PHASE_ORDER, Cycle

__all__ = ["PHASE_COLOURS", "render_html", "render_svg"]

PHASE_COLOURS = {
    "pause": "#f59e0b",
    "setup": "#64748b",
    "update": "#3b82f6",
    "flush": "#8b5cf6",
    "teardown": "#94a3b8",
    "sleep": "#0ea5e9",
    "wake": "#14b8a6",
    "resume": "#10b981",
}
FAIL = "#dc2626"
WIDTH = 1100
LABEL_W = 230  # engine addresses on the left of each panel
PLOT_W = WIDTH - LABEL_W - 30
OVERVIEW_MAX = 500  # bars in the overview


def _e(text: object) -> str:
    s = text if type(text) is str else str(text)
    # Most cells hold none of the five characters html.escape replaces: five scans, no copies
    # (300,000 cells in `refits --all --html` per million events).
    if "&" in s or "<" in s or ">" in s or '"' in s or "'" in s:
        return html.escape(s, quote=True)
    return s


def _nice_step(span: float, ticks: int = 6) -> float:
    raw = max(span / ticks, 1e-6)
    mag = 10 ** (len(str(int(raw * 1000))) - 1) / 1000 if raw >= 0.001 else 0.001
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _legend(y: int) -> list[str]:
    out, x = [], 10
    for phase in PHASE_ORDER:
        out.append(f'<rect x="{x}" y="{y}" width="14" height="10" fill="{PHASE_COLOURS[phase]}"/>')
        out.append(f'<text x="{x + 18}" y="{y + 9}" class="s">{phase}</text>')
        x += 30 + 7 * len(phase)
    out.append(f'<rect x="{x}" y="{y}" width="14" height="10" fill="#ccc" stroke="{FAIL}" stroke-width="2"/>')
    out.append(f'<text x="{x + 18}" y="{y + 9}" class="s">failed (✕)</text>')
    x += 90
    out.append(
        f'<rect x="{x}" y="{y}" width="14" height="10" fill="url(#hatch)" stroke="{FAIL}" stroke-dasharray="3,2"/>'
    )
    out.append(f'<text x="{x + 18}" y="{y + 9}" class="s">no outcome recorded</text>')
    return out


def _overview(cycles: Sequence[Cycle], y0: int) -> tuple[list[str], int]:
    shown = list(cycles)[-OVERVIEW_MAX:]
    height = 120
    out = [f'<text x="10" y="{y0 + 12}" class="h">Refit durations ({len(shown)} cycles)</text>']
    top, base = y0 + 24, y0 + 24 + height
    longest = max((c.end - c.start for c in shown), default=0) or 1e-3
    slot = PLOT_W / max(len(shown), 1)
    bar_w = max(1.0, min(24.0, slot * 0.7))
    out.append(f'<line x1="{LABEL_W}" y1="{base}" x2="{LABEL_W + PLOT_W}" y2="{base}" class="axis"/>')
    out.append(
        f'<text x="{LABEL_W - 6}" y="{top + 8}" class="s" text-anchor="end">{_e(fmt_ms(longest))}</text>'
    )
    out.append(f'<text x="{LABEL_W - 6}" y="{base}" class="s" text-anchor="end">0</text>')
    label_every = max(1, len(shown) // 20)
    for i, c in enumerate(shown):
        x = LABEL_W + i * slot + (slot - bar_w) / 2
        total = c.end - c.start
        tip = f"cycle {c.index}: {c.status}, version {c.version or '-'}, {fmt_ms(total)}, {len(c.engines)} engines"
        out.append(f"<g><title>{_e(tip)}</title>")
        y = base
        phases = c.phases()
        spent = sum(e - s for s, e, _ in phases.values()) or 1e-9
        for phase, (s, e, _n) in phases.items():
            h = height * total / longest * (e - s) / spent
            y -= h
            colour = PHASE_COLOURS.get(phase, "#999")
            fill = colour if c.status != "open" else "none"
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{max(h, 0.5):.1f}" '
                f'fill="{fill}" stroke="{colour}" stroke-width="{0 if fill != "none" else 1}"/>'
            )
        if c.status in ("failed", "abandoned"):
            cx = x + bar_w / 2
            out.append(
                f'<path d="M{cx - 5:.1f},{y - 9:.1f} L{cx + 5:.1f},{y - 9:.1f} L{cx:.1f},{y - 2:.1f} Z" fill="{FAIL}"/>'
            )
        out.append("</g>")
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{base + 12}" class="s" text-anchor="middle">{c.index}</text>'
            )
    return out, base + 22 - y0


def _panel(c: Cycle, y0: int) -> tuple[list[str], int]:
    engines = list(c.engines)
    row_h = 16 if len(engines) <= 16 else 11
    start, span = c.start, max(c.end - c.start, 1e-3)
    failed = c.failures()
    status = c.status
    if failed:
        n = len(failed)
        status += (
            f" ({n} engine{'s' if n != 1 else ''} with {'failures' if c.status != 'open' else 'no outcome'})"
        )
    head = (
        f"cycle {c.index} · version {c.version or '-'} · {status} · {len(engines)} engines · "
        f"{fmt_ms(c.end - c.start)} · {fmt_ts(c.start)}" + ("" if c.paused else " · no pause")
    )
    colour = FAIL if c.status in ("failed", "abandoned") else "#111"
    out = [f'<text x="10" y="{y0 + 14}" class="h" fill="{colour}">{_e(head)}</text>']
    top = y0 + 22
    for r, engine in enumerate(engines):
        y = top + r * row_h
        if r % 2:
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{PLOT_W}" height="{row_h}" fill="#f4f4f5"/>')
        mark = " ✕" if engine in failed else ""
        tip = "; ".join(failed.get(engine, []))
        fill = f' fill="{FAIL}"' if mark else ""
        out.append(
            f'<text x="{LABEL_W - 6}" y="{y + row_h - 4}" class="s" text-anchor="end"{fill}>'
            f"{_e(engine[-34:] + mark)}" + (f"<title>{_e(tip)}</title>" if tip else "") + "</text>"
        )
    rows = {e: i for i, e in enumerate(engines)}
    for span_ in c.spans():
        r = rows.get(span_.engine)
        if r is None:
            continue
        x = LABEL_W + (span_.start - start) / span * PLOT_W
        w = max((span_.end - span_.start) / span * PLOT_W, 2.0)
        y = top + r * row_h + 2
        h = row_h - 4
        colour = PHASE_COLOURS.get(span_.phase, "#999")
        tip = (
            f"{span_.phase} on {span_.engine}: {span_.state}"
            + (f" ({span_.detail})" if span_.detail else "")
            + f", {fmt_ms(span_.end - span_.start)}, op {span_.op_id}"
        )
        out.append(f"<g><title>{_e(tip)}</title>")
        if span_.state == "missing":
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="url(#hatch)" stroke="{FAIL}" stroke-dasharray="3,2"/>'
            )
        elif span_.state == "failed":
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{colour}" fill-opacity="0.45" stroke="{FAIL}" stroke-width="2"/>'
            )
            cx, cy = x + w, y + h / 2
            out.append(
                f'<path d="M{cx - 4:.1f},{cy - 4:.1f} L{cx + 4:.1f},{cy + 4:.1f} M{cx - 4:.1f},{cy + 4:.1f} L{cx + 4:.1f},{cy - 4:.1f}" '
                f'stroke="{FAIL}" stroke-width="2.2"/>'
            )
        else:
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{colour}"/>')
        out.append("</g>")
    axis_y = top + len(engines) * row_h + 2
    out.append(f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{LABEL_W + PLOT_W}" y2="{axis_y}" class="axis"/>')
    step = _nice_step(span)
    t = 0.0
    for _ in range(50):  # bounded: about six ticks
        if t > span + 1e-9:
            break
        x = LABEL_W + t / span * PLOT_W
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" class="axis"/>')
        out.append(
            f'<text x="{x:.1f}" y="{axis_y + 14}" class="s" text-anchor="middle">{_e(fmt_ms(t))}</text>'
        )
        t += step
    return out, axis_y + 26 - y0


def render_svg(cycles: Sequence[Cycle], *, title: str, detail: int | None = 20) -> str:
    """One SVG: legend, overview of every cycle, and panels for the last ``detail`` cycles."""
    body: list[str] = [f'<text x="10" y="22" class="t">{_e(title)}</text>']
    body += _legend(34)
    y = 58
    if not cycles:
        body.append(f'<text x="10" y="{y + 16}" class="h">no refit cycles in the journal</text>')
        y += 30
    else:
        part, h = _overview(cycles, y)
        body += part
        y += h + 10
        shown = list(cycles) if detail is None else list(cycles)[-detail:]
        for c in shown:
            part, h = _panel(c, y)
            body += part
            y += h
    height = y + 10
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="ui-sans-serif, system-ui, sans-serif">'
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fee2e2"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{FAIL}" stroke-width="2"/></pattern>'
        "<style>.t{font-size:16px;font-weight:600}.h{font-size:12px;font-weight:600}"
        ".s{font-size:10px;fill:#333}.axis{stroke:#888;stroke-width:1}</style></defs>"
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>' + "".join(body) + "</svg>"
    )


def render_html(
    cycles: Sequence[Cycle],
    rows: Sequence[dict],
    *,
    title: str,
    detail: int | None = 20,
    total: int | None = None,
) -> str:
    """A self-contained page: the cycle table and the SVG picture (``cycles``: the last ones
    drawn; ``total``: how many there were, when more than those)."""
    cols = list(rows[0]) if rows else []
    return "".join(html_parts(cycles, rows, cols, title=title, detail=detail, total=total))


def html_parts(
    cycles: Sequence[Cycle],
    rows: Iterable[dict],
    cols: Sequence[str],
    *,
    title: str,
    detail: int | None = 20,
    total: int | None = None,
) -> Iterator[str]:
    """``render_html``'s page in pieces, one per table row: written as they come, a table of
    every cycle of a long journal is never held whole (``refits --all --html``)."""
    yield (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>"
        "body{font-family:ui-sans-serif,system-ui,sans-serif;margin:20px;color:#111}"
        "table{border-collapse:collapse;font-size:12px;margin:12px 0}"
        "th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;white-space:nowrap}"
        "td:last-child{white-space:normal;min-width:240px}"
        "th{background:#f4f4f5}tr.bad td{color:#b91c1c}"
        "</style></head><body>"
        f'<h1 style="font-size:20px">{_e(title)}</h1>'
        f"<p>{len(cycles) if total is None else total} refit cycles. Times are UTC. Hover a bar for its operation and outcome.</p>"
        + render_svg(cycles, title="Refit timeline", detail=detail)
    )
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    started = False
    for r in rows:
        if not started:
            yield f'<h2 style="font-size:16px">Cycles</h2><table><tr>{head}</tr>'
            started = True
        yield (
            "<tr"
            + (' class="bad"' if r.get("status") in ("failed", "abandoned") else "")
            + ">"
            + "".join(f"<td>{_e(r.get(c, ''))}</td>" for c in cols)
            + "</tr>"
        )
    if started:
        yield "</table>"
    yield "</body></html>"
