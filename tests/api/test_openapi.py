"""`GET /openapi.json` is generated from the route tables (``OPENAPI_ROUTES`` beside each family's
handlers, assembled by ``smgrl/http/openapi/document.py``) and stays in sync with the gateway: every route the
Quart app registers (the explicit `/v1/rl` writes included), every route the `/v1/rl` dispatcher
knows (`smgrl.http.routes.rl_routes.ALLOW`) and every raw ASGI route (`smgrl.http.fronts.dataplane.ALLOW`, the
session routes) is in the document with exactly its methods, and vice versa; every error code smgrl
can answer with is in it; every error class a route family raises is listed on that family's
routes, and each data-plane and write route documents every code it can answer."""

from __future__ import annotations

import ast
import html
import json
import pathlib
import re

import pytest
from rl_api_helpers import ADMIN, KEYS, TENANTS, rl_cfg

from smgrl.core.config import Config
from smgrl.core.errors import (
    INVALID_REQUEST_CODES,
    DataPlaneError,
    InvalidRequest,
    InvalidSelector,
    InvalidVersionPolicyHeader,
    RlError,
    SelectorRequired,
)
from smgrl.http.fronts import dataplane_routes as dataplane
from smgrl.http.fronts import sessions
from smgrl.http.fronts.dataplane_routes import ALLOW as DATAPLANE_ALLOW
from smgrl.http.fronts.sessions import ROUTES as SESSION_ROUTES
from smgrl.http.openapi import document as openapi
from smgrl.http.routes import refits, rl_routes, rl_writes, routing_loop_api, stream, workers
from smgrl.http.routes.rl_routes import ALLOW, match
from smgrl.testing import gateway_in_process

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTTP_METHODS = {"get", "head", "post", "put", "patch", "delete", "options"}


def _template(path: str) -> str:
    """A comparable form of a path: every parameter becomes `{}`."""
    return re.sub(r"\{[^}]+\}|<(?:[a-z]+:)?[^>]+>", "{}", path)


def _methods(item: dict) -> set[str]:
    return {m.upper() for m in item if m in HTTP_METHODS}


def _sample(template: str) -> bytes:
    """A raw request path matching an OpenAPI path template."""
    return re.sub(r"\{[^}]+\}", "x1", template).encode()


@pytest.mark.parametrize("rl_enabled", [True, False])
async def test_every_route_is_documented_with_its_methods_and_nothing_else(rl_enabled):
    cfg = rl_cfg() if rl_enabled else Config()
    async with gateway_in_process(cfg) as gw:
        doc = (await gw.client.get("/openapi.json")).json()
        documented = {_template(p): _methods(item) for p, item in doc["paths"].items()}

        # 1. Quart's own routes (the /v1/rl catch-all is the dispatcher's: checked below) and the
        # data plane's raw ASGI routes.
        served: dict[str, set[str]] = {}
        for rule in gw.app.url_map.iter_rules():
            if rule.endpoint == "rl":
                continue
            methods = set(rule.methods or ()) - {"OPTIONS"}
            if rule.endpoint.startswith("rl_"):
                # The explicit writes take every method so that the others answer 405, not 404.
                methods = set(rl_writes.ALLOW.split(","))
            if rule.endpoint in refits.ALLOW:  # the same for the refit routes
                methods = set(refits.ALLOW[rule.endpoint].split(","))
            if rule.endpoint in stream.ALLOW:  # and the journal stream and fleet page
                methods = set(stream.ALLOW[rule.endpoint].split(","))
            served.setdefault(_template(rule.rule), set()).update(methods)
        for path, allow in DATAPLANE_ALLOW.items():
            assert _template(path) not in served, path
            served[_template(path)] = set(allow.split(","))
        for path, allow in SESSION_ROUTES.items():
            assert _template(path) not in served, path
            served[_template(path)] = set(allow.split(","))
        assert {"/generate", "/v1/chat/completions", "/v1/models"} <= set(served)
        assert {p: documented.get(p) for p in served} == served

        # 2. The /v1/rl dispatcher: each other documented template routes to one ALLOW entry, with
        # its methods, and every ALLOW entry is documented.
        rl_paths = {p: m for p, m in documented.items() if p not in served}
        if not rl_enabled:
            # D1: a disabled control plane does not describe itself
            assert not any(p.startswith("/v1/rl/") for p in documented)
            assert rl_paths == {}
            assert not any(r.rule.startswith("/v1/rl") for r in gw.app.url_map.iter_rules())
            return
        assert all(p.startswith("/v1/rl/") for p in rl_paths), rl_paths
        routed = {}
        for template, methods in rl_paths.items():
            found = match(_sample(template))
            assert found is not None, template
            assert found[0] not in routed, (template, routed)
            routed[found[0]] = template
            assert methods == set(ALLOW[found[0]].split(",")), template
        assert set(routed) == set(ALLOW)


async def test_the_document_is_served_without_a_key_and_is_the_module_document():
    cfg = rl_cfg(control_plane_keys=KEYS, tenant_keys=TENANTS)
    async with gateway_in_process(cfg) as gw:
        r = await gw.client.get("/openapi.json")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == openapi.document(True)
        assert r.headers["x-request-id"]
        assert (await gw.client.get("/openapi.json", headers=ADMIN)).content == r.content
        head = await gw.client.head("/openapi.json")
        assert head.status_code == 200 and head.content == b""
        assert (await gw.client.post("/openapi.json")).status_code == 405
        # Public: no secret can be in it (it is built from code only, never from config or state).
        for key in KEYS:
            assert key.key.encode() not in r.content
        assert b"tenant-secret" not in r.content


def _codes_in_sources() -> dict[str, set[str]]:
    """Every error code smgrl answers with, read from the sources (so a new one fails this test
    until it is documented)."""
    errors = (ROOT / "smgrl/core/errors.py").read_text()
    # The rollout routes' RL-envelope error is counted with the data plane (_dataplane_codes).
    rl = {cls.code for cls in _descendants(RlError)} - {InvalidVersionPolicyHeader.code}
    rl |= set(
        re.findall(
            r'code, status = "([a-z_]+)", \d+', (ROOT / "smgrl/http/routes/journal_routes.py").read_text()
        )
    )
    # The docstring's table names codes that are not exceptions (upstream_error).
    # (The data plane's rows are in the same table: _dataplane_codes counts those.)
    table = set(re.findall(r"^\s+(?:│\s+)?[├└]── \w+\s+([a-z_]+)\s+\d{3}", errors, re.MULTILINE))
    rl |= table - {cls.code for cls in _descendants(DataPlaneError) - _descendants(RlError)}
    rl.add("upstream_error")
    rl.add("internal_error")  # app.py's answer to a bug
    workers = set(re.findall(r"\b([A-Z][A-Z_]+[A-Z])\b\s+\d{3}", errors))
    for path in (ROOT / "smgrl").rglob("*.py"):
        text = path.read_text()
        workers |= set(re.findall(r'WorkerApiError\(\s*\d{3},\s*"([A-Z_]+)"', text))
    envelope = (ROOT / "smgrl/http/bodies/envelopes.py").read_text()
    openai_codes = set(re.findall(r'openai_error\(\s*\d{3},\s*"([a-z_]+)"', envelope))
    openai_codes |= set(re.findall(r'"code": "([a-z_]+)"', envelope))
    return {"rl": rl, "workers": workers, "openai": openai_codes}


def test_every_error_code_is_in_the_document():
    codes = _codes_in_sources()
    assert {"invalid_engine_path", "journal_unavailable", "upstream_timeout"} <= codes["rl"]
    assert {"BAD_REQUEST", "WORKER_NOT_FOUND", "WORKER_ALREADY_EXISTS"} <= codes["workers"]
    assert {"unknown_url", "method_not_allowed", "request_body_too_large", "invalid_api_key"} <= codes[
        "openai"
    ]
    doc = openapi.document(True)
    schemas = doc["components"]["schemas"]

    # The RL envelope is rendered per response, with exactly the codes the route lists.
    documented_rl = _reachable_codes(doc, {"responses": doc["paths"]})
    assert codes["rl"] <= documented_rl, codes["rl"] - documented_rl
    assert codes["workers"] <= set(schemas["WorkerApiError"]["properties"]["code"]["enum"])
    openai_documented = set(schemas["OpenAIError"]["properties"]["error"]["properties"]["code"]["enum"])
    openai_documented |= set(schemas["ApiKeyError"]["properties"]["error"]["properties"]["code"]["enum"])
    assert codes["openai"] <= openai_documented, codes["openai"] - openai_documented


def _descendants(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_descendants(sub)}
    return out


def _dataplane_codes() -> dict[str, set[str]]:
    """The data plane's codes, from its sources: its exceptions, its RL-envelope error, and the
    OpenAI-style answers the ASGI handler makes itself."""
    # InvalidRequest answers SMG's codes for a refused body, listed in INVALID_REQUEST_CODES.
    own = {cls.code for cls in _descendants(DataPlaneError) - {InvalidRequest}} | set(INVALID_REQUEST_CODES)
    handler = "\n".join(
        (ROOT / f"smgrl/http/fronts/{name}.py").read_text() for name in ("dataplane", "relay", "asgi")
    )
    openai_codes = set(re.findall(r'_openai_error\(\s*send, rid, \d+, "([a-z_]+)"', handler))
    openai_codes |= set(re.findall(r'"code": "([a-z_]+)"', handler))
    if "api_key_error_body(" in handler:
        # The 401 body is built by envelopes.api_key_error_body: take its code from there.
        envelope = (ROOT / "smgrl/http/bodies/envelopes.py").read_text()
        builder = envelope.split("def api_key_error_body", 1)[1].split("\ndef ", 1)[0]
        openai_codes |= set(re.findall(r'"code": "([a-z_]+)"', builder))
    return {"own": own, "openai": openai_codes, "rl": {InvalidVersionPolicyHeader.code}}


def _reachable_codes(doc: dict, op: dict) -> set[str]:
    """Every enum value reachable from an operation's responses ($refs resolved)."""
    out: set[str] = set()

    def walk(node, seen=()):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref and ref not in seen:
                _, _, kind, name = ref.split("/")
                walk(doc["components"][kind][name], (*seen, ref))
            for key, value in node.items():
                if key == "enum":
                    out.update(v for v in value if isinstance(v, str))
                else:
                    walk(value, seen)
        elif isinstance(node, list):
            for item in node:
                walk(item, seen)

    walk(op["responses"])
    return out


def test_every_dataplane_and_write_error_code_is_documented_on_its_routes():
    codes = _dataplane_codes()
    assert {"no_eligible_workers", "model_required", "request_timeout", "too_many_requests"} <= codes["own"]
    assert codes["openai"] == {"method_not_allowed", "request_body_too_large", "invalid_api_key"}
    assert codes["rl"] == {"invalid_version_policy"}
    doc = openapi.document(True)
    schemas = doc["components"]["schemas"]
    assert codes["own"] == set(schemas["DataPlaneError"]["properties"]["error"]["properties"]["code"]["enum"])
    assert "reasons" in schemas["DataPlaneError"]["properties"]["error"]["properties"]
    rollout = {p for p, allow in DATAPLANE_ALLOW.items() if allow == "POST"}
    for path in rollout:
        op = doc["paths"][path]["post"]
        reachable = _reachable_codes(doc, op)
        assert codes["own"] | codes["openai"] | codes["rl"] <= reachable, (path, codes["own"] - reachable)
        headers = set(op["responses"]["200"]["headers"])
        assert {
            "x-smg-weight-version",
            "x-version-tag",
            "x-smg-mixed-version",
            "x-smg-routed-worker-id",
            "x-smgrl-worker-id",
            "x-request-id",
        } <= headers
        assert "text/event-stream" in op["responses"]["200"]["content"]
        assert {"400", "401", "404", "405", "413", "429", "502", "503", "504"} <= set(op["responses"])
    # Without --enable-rl there is no version policy header, hence no invalid_version_policy.
    plain = openapi.document(False)
    assert "invalid_version_policy" not in _reachable_codes(plain, plain["paths"]["/generate"]["post"])
    assert "invalid_api_key" in _reachable_codes(doc, doc["paths"]["/v1/models"]["get"])

    # The explicit writes: every RlError their routes and their service (smgrl/control/writes.py)
    # name, and the selector's (rl_routes.selector_param), is documented on the routes.
    raised = _raised_in(FAMILIES["rl_writes"][1]) | {SelectorRequired.code, InvalidSelector.code}
    listed = set().union(*(route.codes() for route in rl_writes.OPENAPI_ROUTES))
    assert raised == listed - {"request_body_too_large", "PAYLOAD_TOO_LARGE"}  # the shared 413
    selector_codes = {"selector_required", "invalid_selector", "no_workers_match"}
    for path in ("/v1/rl/workers/{id}/version", "/v1/rl/workers/{id}/state"):
        assert raised - selector_codes <= _reachable_codes(doc, doc["paths"][path]["post"]), path
    for path in ("/v1/rl/version", "/v1/rl/state"):
        reachable = _reachable_codes(doc, doc["paths"][path]["post"])
        assert raised - {"worker_not_found"} <= reachable, path
        (param,) = doc["paths"][path]["post"]["parameters"]
        assert (param["name"], param["in"], param["required"]) == ("selector", "query", True)


def test_every_ref_resolves_and_every_path_parameter_is_declared():
    doc = openapi.document(True)
    text = json.dumps(doc)
    for ref in set(re.findall(r'"\$ref": "#/components/(\w+)/(\w+)"', text)):
        assert ref[1] in doc["components"][ref[0]], ref
    for path, item in doc["paths"].items():
        names = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in item.items():
            declared = {p["name"] for p in op.get("parameters", ()) if p["in"] == "path"}
            assert declared == names, (method, path)
            assert "x-request-id" in json.dumps(op["responses"]) or all(
                "$ref" in r for r in op["responses"].values()
            )
        # Every operation answers with at least one documented status and carries x-request-id.
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_schemathesis_accepts_the_document():
    schemathesis = pytest.importorskip("schemathesis")
    schema = schemathesis.openapi.from_dict(openapi.document(True))
    labels = {r.ok().label for r in schema.get_all_operations()}
    assert "POST /v1/rl/engine/{path}" in labels and "DELETE /workers/{worker_id}" in labels


@pytest.mark.parametrize("rl_enabled", [True, False])
async def test_docs_is_the_document_rendered_with_nothing_loaded_from_elsewhere(rl_enabled):
    """`GET /docs`: an HTML page of every path and operation of /openapi.json, rendered by the
    gateway (no script, no stylesheet or font from a CDN), as open as /openapi.json."""
    cfg = rl_cfg(control_plane_keys=KEYS, tenant_keys=TENANTS) if rl_enabled else Config()
    async with gateway_in_process(cfg) as gw:
        doc = (await gw.client.get("/openapi.json")).json()
        r = await gw.client.get("/docs")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert r.headers["x-request-id"]
        assert "default-src 'none'" in r.headers["content-security-policy"]
        page = r.text
        assert page.startswith("<!doctype html>")
        # Nothing external: no script, no stylesheet link, no src=; every link stays in the page
        # and names an anchor the page has.
        assert not re.search(r"<script|<link|<img|<iframe|@import|\bsrc\s*=|url\(", page, re.IGNORECASE)
        anchors = set(re.findall(r'\bid="([^"]+)"', page))
        hrefs = re.findall(r'\bhref\s*=\s*"([^"]*)"', page)
        assert hrefs and all(h.startswith("#") and h[1:] in anchors for h in hrefs), hrefs
        # Every path and every operation of the document is on the page; every schema too.
        for path, item in doc["paths"].items():
            for method in _methods(item):
                heading = f'<span class="m">{method.lower()}</span> <code>{html.escape(path)}</code></h3>'
                assert heading in page, (method, path)
        for name in doc["components"]["schemas"]:
            assert f'id="schema-{name}"' in page, name
        assert ("/v1/rl/workers" in page) is rl_enabled  # D1: a disabled control plane is not described
        # Same auth as /openapi.json: no key needed, an admin key changes nothing; HEAD; no POST.
        assert (await gw.client.get("/docs", headers=ADMIN)).content == r.content
        head = await gw.client.head("/docs")
        assert head.status_code == 200 and head.content == b""
        assert (await gw.client.post("/docs")).status_code == 405
        for key in KEYS:
            assert key.key not in page


def test_docs_page_escapes_what_it_renders():
    """Text from the document is escaped (a description with markup stays text)."""
    from smgrl.http.openapi import html as openapi_html

    doc = {
        "openapi": "3.0.3",
        "info": {"title": "t<b>", "version": "1", "description": "<script>x</script>"},
        "paths": {"/a/{id}": {"get": {"operationId": "o<1>", "summary": "<i>s</i>", "responses": {}}}},
        "components": {"schemas": {"S": {"description": "</pre><script>"}}},
    }
    page = openapi_html.render(doc)
    assert "<script" not in page and "<i>" not in page and "t<b>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page


def test_every_session_error_code_is_documented_on_the_session_routes():
    from smgrl.http.openapi.document import document
    from smgrl.sessions.errors import ALL

    doc = json.dumps(document(False)["paths"])
    for error in ALL:
        assert error.code in doc, error.code


# -- the route tables: every error class a family raises is listed on its routes -------------------

# Each route family: its table, and the sources whose errors its routes answer (the handlers and
# the services they call).
FAMILIES = {
    "rl": (
        rl_routes,
        [
            "smgrl/http/routes/rl_routes.py",
            "smgrl/http/fronts/rl_front.py",
            "smgrl/http/routes/journal_routes.py",
            "smgrl/control",
        ],
    ),
    "rl_writes": (rl_writes, ["smgrl/http/routes/rl_writes.py", "smgrl/control/writes.py"]),
    "refits": (refits, ["smgrl/http/routes/refits.py", "smgrl/refit"]),
    "stream": (stream, ["smgrl/http/routes/stream.py"]),
    "routing_loop": (
        routing_loop_api,
        ["smgrl/http/routes/routing_loop.py", "smgrl/http/routes/routing_loop_api.py"],
    ),
    "dataplane": (
        dataplane,
        [
            "smgrl/http/fronts/dataplane.py",
            "smgrl/http/fronts/relay.py",
            "smgrl/http/fronts/dataplane_routes.py",
            "smgrl/http/bodies/dataplane_body.py",
            "smgrl/dataplane",
        ],
    ),
    "sessions": (sessions, ["smgrl/http/fronts/sessions.py", "smgrl/sessions"]),
}


def _error_classes() -> dict[str, type]:
    import smgrl.refit.errors
    import smgrl.sessions.errors  # noqa: F401
    from smgrl.core.errors import ApiError

    bases = {ApiError, RlError, DataPlaneError}
    return {cls.__name__: cls for cls in _descendants(ApiError) if cls not in bases}


def _raised_in(paths: list[str]) -> set[str]:
    """The codes of the error classes these sources name (a class named is a class raised or
    caught and answered; InvalidRequest answers SMG's body codes)."""
    classes = _error_classes()
    files = [f for p in paths for f in ((ROOT / p).rglob("*.py") if (ROOT / p).is_dir() else [ROOT / p])]
    codes: set[str] = set()
    for f in files:
        # The code before the table (the table itself, and imports made for it, do not count).
        tree = ast.parse(f.read_text().split("# -- /openapi.json", 1)[0])
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for name in used & set(classes):
            cls = classes[name]
            codes |= set(INVALID_REQUEST_CODES) if cls is InvalidRequest else {cls.code}
    return codes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_error_a_family_raises_is_listed_on_its_routes(family):
    module, sources = FAMILIES[family]
    raised = _raised_in(sources)
    listed = set().union(*(route.codes() for route in module.OPENAPI_ROUTES))
    assert raised, family  # the scan finds something: it can fail
    assert raised <= listed, (family, raised - listed)


def test_every_error_class_is_listed_on_some_route():
    listed = set().union(*(route.codes() for route in openapi.routes(True)))
    every = {cls.code for cls in _error_classes().values() if cls is not InvalidRequest} | set(
        INVALID_REQUEST_CODES
    )
    assert every <= listed, every - listed
    # and the /workers codes, the framework's and the --api-key's
    workers_codes = _codes_in_sources()["workers"]
    assert workers_codes - {"PAYLOAD_TOO_LARGE"} <= set().union(*(r.codes() for r in workers.OPENAPI_ROUTES))
    assert "invalid_api_key" in listed and "method_not_allowed" in listed


def test_the_families_that_check_methods_themselves_serve_their_tables_methods():
    """The raw fronts (data plane, sessions, the /v1/rl dispatcher and its raw fronts) and the
    routes that answer their own 405 (refits, journal stream) take their `allow` tables from the
    route tables: a route added to a table is served with the methods it is documented with."""
    assert dataplane.ALLOW == {
        "/generate": "POST",
        "/v1/completions": "POST",
        "/v1/chat/completions": "POST",
        "/v1/models": "GET,HEAD",
        "/v1/models/{model}": "GET,HEAD",
    }
    assert sessions.ROUTES["/sessions/{sid}"] == "GET,DELETE"
    assert rl_routes.ALLOW == {
        "workers": "GET,HEAD",
        "worker": "GET,HEAD",
        "proxy": "GET,HEAD,POST",
        "fanout": "GET,HEAD,POST",
        "operation": "GET,HEAD",
        "journal": "GET,HEAD",
    }
    assert refits.ALLOW["refit_quarantine"] == "POST,DELETE" and refits.ALLOW["refit_events"] == "GET"
    assert stream.ALLOW == {"journal_stream": "GET", "fleet_page": "GET,HEAD"}
    for module, allow, key in (
        (dataplane, dataplane.ALLOW, "path"),
        (sessions, sessions.ROUTES, "path"),
        (rl_routes, rl_routes.ALLOW, "name"),
        (refits, refits.ALLOW, "name"),
        (stream, stream.ALLOW, "name"),
    ):
        for route in module.OPENAPI_ROUTES:
            assert route.method in allow[getattr(route, key)].split(","), route
