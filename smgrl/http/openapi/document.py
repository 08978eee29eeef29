"""The OpenAPI 3 document of the gateway, served at ``GET /openapi.json``: generated from the route
tables that each route family declares beside its handlers (``OPENAPI_ROUTES``, see ``families``), so the
document says what the tables say and nothing else. ``smgrl/http/openapi/apidoc.py`` has the pieces a
table is written with; ``smgrl/http/openapi/schemas.py`` the models several families share.

To add a route: add a ``Route`` to the ``OPENAPI_ROUTES`` of the module that registers it (its models as
``@model`` attrs classes beside it, its errors as the error classes it raises, listed under the
status they answer); a new module goes into ``families``. ``tests/api/test_openapi.py`` fails
until every served route has a table entry (and vice versa) and every error class the family
raises is listed on its routes.

``/openapi.json`` needs no key: it describes routes, never data (no worker, key, label or journal
content is in it), and SMG clients and fuzzers need it before they hold a key. With RL disabled the
``rl_only`` routes are left out, as the routes themselves are (D1: a disabled control plane does
not describe itself).
"""

from __future__ import annotations

import json
from typing import Any

from smgrl import __version__
from smgrl.http.openapi.apidoc import Resp, RlOnly, Route, model_schema, schema_of
from smgrl.http.openapi.schemas import FORBIDDEN, REQUEST_ID, UNAUTHORIZED

OPENAPI_VERSION = "3.0.3"

# A bearer key, or none when the gateway runs without keys (development mode): `{}` makes it optional.
SECURITY = {
    "control": [{"bearer": []}, {}],
    "data": [{"dataPlaneBearer": []}, {}],
    "open": [],
}


def families() -> list[tuple[Route, ...]]:
    """Every route family's table. (Imported when asked, not at the top: the document is built once per
    process, and a module that only renders it need not load every route family.)"""
    from smgrl.http.fronts import dataplane_routes, sessions
    from smgrl.http.routes import (
        engine_reads,
        flush_cache,
        probes,
        refits,
        rl_routes,
        rl_writes,
        routing_loop_api,
        stream,
        workers,
    )

    return [
        probes.OPENAPI_ROUTES,
        workers.OPENAPI_ROUTES,
        engine_reads.OPENAPI_ROUTES,
        flush_cache.OPENAPI_ROUTES,
        routing_loop_api.OPENAPI_ROUTES,
        dataplane_routes.OPENAPI_ROUTES,
        sessions.OPENAPI_ROUTES,
        rl_writes.OPENAPI_ROUTES,
        refits.OPENAPI_ROUTES,
        stream.OPENAPI_ROUTES,
        rl_routes.OPENAPI_ROUTES,
    ]


def routes(rl_enabled: bool = True) -> list[Route]:
    """The routes the gateway serves with this setting, in document order."""
    return [r for table in families() for r in table if rl_enabled or not r.rl_only]


_DROPPED = object()


class _Builder:
    def __init__(self, rl_enabled: bool) -> None:
        self.rl = rl_enabled
        self.models: dict[str, type] = {}
        self.shared: dict[str, dict] = {}

    def keep(self, node: Any) -> Any:
        """Drop what only RL-enabled gateways serve (``RlOnly``) when RL is disabled."""
        if isinstance(node, RlOnly):
            return self.keep(node.value) if self.rl else _DROPPED
        if isinstance(node, dict):
            return {k: v for k, v in ((k, self.keep(v)) for k, v in node.items()) if v is not _DROPPED}
        if isinstance(node, (list, tuple)):
            return [v for v in (self.keep(v) for v in node) if v is not _DROPPED]
        return node

    def schema(self, node: Any) -> dict:
        return schema_of(self.keep(node), self.models)

    def response(self, resp: Resp, head: bool = False) -> dict:
        if resp.name and not head:
            if resp.name not in self.shared:
                self.shared[resp.name] = self.response(Resp(resp.description, resp.content, resp.headers))
            return {"$ref": f"#/components/responses/{resp.name}"}
        out: dict[str, Any] = {
            "description": self.keep(resp.description),
            "headers": {**REQUEST_ID, **resp.headers},
        }
        if resp.content and not head:
            out["content"] = {media: {"schema": self.schema(s)} for media, s in resp.content.items()}
        return out

    def operation(self, route: Route, method: str) -> dict:
        head = method == "HEAD"
        responses = dict(route.responses)
        if route.security == "control" and not route.role:
            raise ValueError(
                f"{route.method} {route.path}: a control-plane route needs a role (read or admin)"
            )
        if route.security == "control":
            responses["401"] = UNAUTHORIZED
            if route.role == "admin":
                responses["403"] = FORBIDDEN
        op: dict[str, Any] = {
            "operationId": route.operation_id.replace("get", "head", 1) if head else route.operation_id,
            "summary": ("HEAD of " if head else "") + route.summary,
        }
        if route.description:
            op["description"] = route.description
        op["tags"] = [route.tag]
        op["security"] = SECURITY[route.security]
        params = [p.render(self.models) for p in self.keep(route.params)]
        if params:
            op["parameters"] = params
        if route.body is not None and not head:
            body = route.body
            op["requestBody"] = {
                "required": body.required,
                "content": {body.media: {"schema": self.schema(body.schema)}},
            }
            if body.description:
                op["requestBody"]["description"] = body.description
        # A shared response keeps its $ref on HEAD too: its headers are the GET's.
        op["responses"] = {
            status: self.response(resp, head=head and not resp.name) for status, resp in responses.items()
        }
        return op

    def paths(self) -> dict:
        out: dict[str, dict] = {}
        for route in routes(self.rl):
            item = out.setdefault(route.path, {})
            method = route.method.lower()
            if method in item:
                raise ValueError(f"{route.method} {route.path} is in two route tables")
            item[method] = self.operation(route, route.method)
            if route.method == "GET" and route.head:
                item["head"] = self.operation(route, "HEAD")
        return out

    def components(self) -> dict:
        schemas: dict[str, dict] = {}
        # Models reach other models: render until no new one appears.
        while set(self.models) - set(schemas):
            for name in sorted(set(self.models) - set(schemas)):
                schemas[name] = self.keep(model_schema(self.models[name], self.models))
        return {name: schemas[name] for name in sorted(schemas)}


def document(rl_enabled: bool = True) -> dict:
    """The OpenAPI document (a fresh copy)."""
    builder = _Builder(rl_enabled)
    paths = builder.paths()
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "smgrl",
            "version": __version__,
            "description": "RL control plane for fleets of LLM inference engines, wire-compatible with SMG "
            "1.13.0's /v1/rl (differences: docs/deviations.md). Every response carries x-request-id. "
            "Auth (--control-plane-api-keys): `admin` reaches every route; `user` reads discovery, the "
            "journal routes and GET /workers. Unknown routes are 404 and wrong methods 405 before auth.",
        },
        "tags": [
            {"name": "rl", "description": "The RL control plane (--enable-rl)"},
            {"name": "workers", "description": "SMG's worker registry API"},
            {"name": "dataplane", "description": "Rollout traffic (--api-key / tenant keys)"},
            {"name": "sessions", "description": "Agent sessions captured token-exact (--tokenizer-path)"},
            {"name": "psrl", "description": "PSRL's coordinator controls of the routing loop"},
            {"name": "probes"},
            {"name": "meta"},
        ],
        "paths": paths,
        "components": {
            "schemas": builder.components(),
            "responses": {name: builder.shared[name] for name in sorted(builder.shared)},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A --control-plane-api-keys key (or the --api-key when no control-plane "
                    "key is configured). With no key configured at all, every route is open.",
                },
                "dataPlaneBearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The --api-key or a tenant key (the data-plane routes). With neither "
                    "configured, the data plane is open.",
                },
            },
        },
    }


_RENDERED: dict[bool, bytes] = {}


def rendered(rl_enabled: bool) -> bytes:
    """The document as compact JSON bytes, built once per process."""
    body = _RENDERED.get(rl_enabled)
    if body is None:
        body = json.dumps(document(rl_enabled), separators=(",", ":")).encode()
        _RENDERED[rl_enabled] = body
    return body
