"""The response head's header checks for the patched hypercorn (patch 12 of
``smgrl.http.hypercorn_patches``): h11's own checks of each header, made in one C call per header,
a name seen before known good. smgrl's own server takes h11's value pattern from here too
(``FIELD_VALUE``, in ``smgrl.http.server.wire``); its known-good names are its own (they exclude
the framing names), so the reference and the server do not share the check under test."""

from __future__ import annotations

from typing import Any

import h11

# h11's header checks (h11/_headers.py), made here in one C call per header (patch 12).
_FIELD_NAME = getattr(getattr(h11, "_headers", None), "_field_name_re", None)
_FIELD_VALUE = getattr(getattr(h11, "_headers", None), "_field_value_re", None)
_GOOD_NAMES: set[bytes] = set()  # header names that passed h11's name check (a few dozen)
GOOD_NAMES = _GOOD_NAMES
FIELD_VALUE = _FIELD_VALUE  # None: this h11 has no such pattern (then nothing is known good)
_GOOD_NAMES_MAX = 4096


def checked_response(headers: list, status_code: Any, known: int = 0) -> h11.Response:
    """``h11.Response(headers=headers, status_code=status_code)``, with h11's checks of each
    header made here, cheaper: a name seen before is known good, a value is one ``fullmatch``
    of h11's own pattern. h11 then takes the headers as checked (``_parsed``) and still makes
    its content-length and transfer-encoding checks. Anything unusual (a name or value that is
    not ``bytes``, a status that is not an ``int``, a header h11 would refuse) goes through the
    stock construction, which then raises h11's own error. ``known``: how many of the first
    headers the caller already checked so (``bytes``, a name in ``GOOD_NAMES``, a value matching ``FIELD_VALUE``)."""
    if _FIELD_VALUE is None or _FIELD_NAME is None or type(status_code) is not int:
        return h11.Response(headers=headers, status_code=status_code)
    good = _GOOD_NAMES
    for name, value in headers[known:] if known else headers:
        if type(name) is not bytes or type(value) is not bytes or not _FIELD_VALUE.fullmatch(value):
            return h11.Response(headers=headers, status_code=status_code)
        if name not in good:
            if not _FIELD_NAME.fullmatch(name):
                return h11.Response(headers=headers, status_code=status_code)
            if len(good) < _GOOD_NAMES_MAX:
                good.add(name)
    return h11.Response(headers=headers, status_code=status_code, _parsed=True)
