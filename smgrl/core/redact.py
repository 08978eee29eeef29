"""An engine's answer with its secrets cut out, before the gateway relays it to a caller.

SGLang's ``/get_server_info`` is its launch arguments as a dict (``dataclasses.asdict``):
``api_key``, ``admin_api_key`` and ``ssl_keyfile_password`` in clear (sgl-project/sglang#30166,
#37457), and a ``launch_command`` may repeat them; vLLM's dev ``/server_info`` carries its
environment. SMG 1.13.0 relays such answers as they are, on routes that need no key; smgrl masks
them (docs/deviations.md): a field whose name says it is a secret gets ``***`` (``null`` stays
``null``: whether a key is configured is still visible), and every occurrence of a secret found
so, or of a key the caller passes (the worker's own), is cut out of every other string. A body
that is not JSON gets the known keys cut out of its bytes.

Used where an engine's answer leaves the gateway's hands: relayed on a keyless route
(``smgrl/http/routes/engine_reads.py``) and kept in the journal (a control call's ``excerpt``,
``smgrl/control/outcome.py``), which a ``user`` key may read.

Pure: bytes in, bytes out; an answer with nothing to mask is returned as it came (same bytes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

MASK = "***"
# Field names (lowercase) that hold a secret: exact names, and name endings.
SECRET_NAMES = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "hf_token", "access_token"})
SECRET_ENDINGS = ("_api_key", "apikey", "password", "secret", "_auth_token")


def is_secret_name(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_NAMES or lowered.endswith(SECRET_ENDINGS)


def _found(doc: Any, out: set[str]) -> None:
    """The secret values ``doc`` holds under a secret field name, anywhere in it."""
    if isinstance(doc, dict):
        for name, value in doc.items():
            if isinstance(value, str) and value and is_secret_name(str(name)):
                out.add(value)
            else:
                _found(value, out)
    elif isinstance(doc, list):
        for value in doc:
            _found(value, out)


def _masked(doc: Any, secrets: list[str]) -> Any:
    if isinstance(doc, dict):
        return {
            name: MASK
            if isinstance(value, str) and value and is_secret_name(str(name))
            else _masked(value, secrets)
            for name, value in doc.items()
        }
    if isinstance(doc, list):
        return [_masked(value, secrets) for value in doc]
    if isinstance(doc, str):
        for secret in secrets:
            doc = doc.replace(secret, MASK)
    return doc


def redact_doc(doc: Any, known: Iterable[str | None] = ()) -> Any:
    """A parsed JSON answer without its secrets (``doc`` itself when there is none)."""
    keys = {k for k in known if k}
    _found(doc, keys)
    # Longest first: a secret that contains another is cut whole.
    masked = _masked(doc, sorted(keys, key=len, reverse=True))
    return doc if masked == doc else masked


def redact_answer(data: bytes, known: Iterable[str | None] = ()) -> bytes:
    """``data`` (an engine's answer body) without its secrets; ``known``: keys to cut out
    wherever they appear (the worker's key, which the engine was sent)."""
    keys = {k for k in known if k}
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if not isinstance(doc, (dict, list)):
        for key in sorted(keys, key=len, reverse=True):
            data = data.replace(key.encode(), MASK.encode())
        return data
    masked = redact_doc(doc, keys)
    if masked is doc:
        return data
    return json.dumps(masked, ensure_ascii=False, separators=(",", ":")).encode()
