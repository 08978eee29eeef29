"""Compact JSON as bytes: the one encoder for every answer the gateway (and the fakes) write.

``json_bytes(obj)`` equals ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` encoded
as UTF-8, byte for byte: the encoder is built once (``json.dumps`` with non-default options builds
a ``JSONEncoder`` on every call). Key order is kept (answers mirror what engines sent); the
journal's canonical form, with sorted keys, is ``journal.codec``'s own.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_bytes"]

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_bytes(obj: Any) -> bytes:
    return _encode(obj).encode("utf-8")
