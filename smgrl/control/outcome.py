"""How one engine answer (or transport failure) becomes an ``RlCallOutcome`` and a fan-out entry.

Pure: no I/O. The decoding rules are SMG 1.13.0's, observed black-box (docs/rl-control-plane.md, "Calling
one engine"): JSON is embedded only when the engine's content-type contains ``json`` (case-
sensitive) and the bytes parse as serde_json would parse them; otherwise the body is lossy UTF-8
text, ``""`` when empty (never null). Bodies beyond the cap are cut and never parsed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from smgrl.core import redact_doc
from smgrl.core.errors import RlError

BODY_CAP = 1_048_576  # 1 MiB kept per engine answer, as SMG
EXCERPT_CAP = 2048  # characters of an answer kept in the journal


class _NotJson(ValueError):
    pass


def _parse_int(text: str) -> int | float:
    # serde_json keeps integers that fit u64 (or i64 when negative); larger ones become floats,
    # and so does `-0` (serde_json parses it as the float -0.0).
    value = int(text)
    if value == 0 and text.startswith("-"):
        return -0.0
    if -(2**63) <= value < 2**64:
        return value
    return float(value)


_SURROGATE = re.compile("[\ud800-\udfff]")
SERDE_MAX_DEPTH = 127  # serde_json's recursion limit: 128 nested arrays/objects fail to parse


def _serde_refuses(value: Any) -> bool:
    """What Python's json accepts but serde_json does not: a lone surrogate escape (Python pairs
    valid ones, so any surrogate left is lone; it could not even be re-encoded), or nesting
    deeper than serde's recursion limit."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, (list, dict)):
            if depth >= SERDE_MAX_DEPTH:
                return True
            items = v if isinstance(v, list) else [*v.keys(), *v.values()]
            stack.extend((x, depth + 1) for x in items)
    return False


def _may_be_refused(text: str) -> bool:
    """False when ``_serde_refuses`` cannot find anything in what ``text`` parses to, without
    walking it: a lone surrogate can only come from a ``\\u`` escape (strict UTF-8 decoding
    refuses encoded surrogates), and nesting needs at least as many ``[`` and ``{``. An engine's
    usual answer (a small JSON object) is then returned at once, once per engine of a fan-out."""
    return "\\u" in text or text.count("[") + text.count("{") >= SERDE_MAX_DEPTH


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotJson("number out of range")  # serde_json refuses 1e400
    return value


def _parse_constant(text: str) -> Any:
    raise _NotJson(f"{text} is not JSON")  # NaN / Infinity are Python-only extensions


def decode_engine_body(data: bytes, content_type: str | None, truncated: bool) -> Any:
    if not truncated and content_type is not None and "json" in content_type and data:
        try:
            text = data.decode("utf-8")
            value = json.loads(
                text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
            )
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
        else:
            if not _may_be_refused(text) or not _serde_refuses(value):
                return value
    return data.decode("utf-8", errors="replace")


@attrs.frozen
class Outcome:
    """The result of one control call to one worker: an engine answer or an error."""

    worker_id: str
    url: str
    control_url: str | None
    latency_ms: int = 0
    status: int | None = None
    body: Any = None
    body_truncated: bool = False
    error: RlError | None = None
    # How far a failed exchange got: "connect", "send", "head" (no answer before the deadline) or
    # "body" (the answer was cut off); None when the engine answered or nothing was sent.
    stage: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300

    def envelope(self) -> dict[str, Any]:
        """``RlCallOutcome``: ``body_truncated`` is omitted unless set."""
        out = {
            "worker_id": self.worker_id,
            "url": self.url,
            "status": self.status,
            "latency_ms": self.latency_ms,
            "body": self.body,
        }
        if self.body_truncated:
            out["body_truncated"] = True
        return out

    def failed_entry(self, connection_mode: str) -> dict[str, Any] | None:
        """The fan-out ``failed[]`` entry, or None for a 2xx answer."""
        if self.error is not None:
            entry = {
                "worker_id": self.worker_id,
                "url": self.url,
                "error": self.error.code,
                "message": self.error.message,
            }
            if self.error.code == "no_control_endpoint":
                entry["connection_mode"] = connection_mode
            return entry
        if self.ok:
            return None
        return {
            "worker_id": self.worker_id,
            "url": self.url,
            "error": "upstream_error",
            "message": f"HTTP {self.status}",
            "status": self.status,
        }

    @property
    def metric_result(self) -> str | None:
        """``smg_rl_control_calls_total`` result label; None when no send was attempted."""
        if self.error is None:
            return "ok" if self.ok else "upstream_error"
        return {"upstream_timeout": "timeout", "upstream_unreachable": "unreachable"}.get(self.error.code)

    def excerpt(self) -> str:
        """A bounded text excerpt of the answer for the journal (never the whole 1 MiB)."""
        if self.error is not None:
            return ""
        # The engine's own secrets (SGLang's server_info holds its keys) never reach the journal,
        # which `user` keys may read (smgrl/core/redact.py).
        body = self.body if isinstance(self.body, str) else redact_doc(self.body)
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        return text[:EXCERPT_CAP]


def fanout_body(outcomes: list[Outcome], modes: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``RlFanoutResponse`` and its status: 200 iff nothing failed, else 207."""
    results = {}
    failed = []
    succeeded = 0
    for o in sorted(outcomes, key=lambda o: o.worker_id):
        if o.answered:
            results[o.worker_id] = o.envelope()
        entry = o.failed_entry(modes.get(o.worker_id, "http"))
        if entry is None:
            succeeded += 1
        else:
            failed.append(entry)
    body = {"results": results, "failed": failed, "total": len(outcomes), "succeeded": succeeded}
    return (200 if not failed else 207), body
