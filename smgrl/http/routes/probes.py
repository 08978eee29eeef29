"""The OpenAPI table of the routes the app registers itself: probes (``/health``, ``/liveness``,
``/readiness``) and the API description (``/openapi.json``, ``/docs``).

Apart from ``smgrl/http/app.py`` so that the document (``smgrl/http/openapi/document.py``) reads
every family's table without importing the app that serves it.
"""

from __future__ import annotations

from typing import Literal

from smgrl.http.openapi.apidoc import HTML, OBJECT, TEXT, Resp, Route, as_json, field, model
from smgrl.registry import GATEWAY_ID_HEADER


@model
class Readiness:
    status: Literal["ready", "not_ready"]
    healthy_workers: int = field(minimum=0)
    total_workers: int = field(minimum=0)


# /openapi.json: the routes smgrl/http/app.py registers itself (the other families' tables are beside
# their handlers).
_SERVING = Resp(
    "Serving.",
    TEXT,
    {
        GATEWAY_ID_HEADER: {
            "description": "this gateway's id (its journal's id): discovery refuses a worker URL whose "
            "`/health` answers with its own id (the URL leads back to this gateway)",
            "required": True,
            "schema": {"type": "string"},
        }
    },
)
# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    Route(
        "GET",
        "/health",
        "getHealth",
        "probes",
        "Liveness (always 200 `OK` while serving)",
        {"200": _SERVING},
        security="open",
    ),
    Route(
        "GET",
        "/liveness",
        "getLiveness",
        "probes",
        "Liveness (always 200 `OK` while serving)",
        {"200": _SERVING},
        security="open",
    ),
    Route(
        "GET",
        "/readiness",
        "getReadiness",
        "probes",
        "Ready when at least one worker is healthy",
        {"200": Resp("Ready.", as_json(Readiness)), "503": Resp("No healthy worker.", as_json(Readiness))},
        security="open",
    ),
    Route(
        "GET",
        "/openapi.json",
        "getOpenapi",
        "meta",
        "This document (no key needed: it describes routes, not data)",
        {"200": Resp("The OpenAPI document.", as_json(OBJECT))},
        security="open",
    ),
    Route(
        "GET",
        "/docs",
        "getDocs",
        "meta",
        "This document as an HTML page rendered by the gateway (no script, nothing loaded from elsewhere; "
        "no key needed)",
        {"200": Resp("The page.", HTML)},
        security="open",
    ),
)
