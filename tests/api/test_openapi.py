"""`GET /openapi.json` stays in sync with the gateway: every route the Quart app registers and every
route the `/v1/rl` dispatcher knows (`smgrl.api.rl.ALLOW`) is in the document with exactly its
methods, and vice versa; every error code smgrl can answer with is in it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from rl_api_helpers import ADMIN, KEYS, TENANTS, rl_cfg

from smgrl.api import openapi
from smgrl.api.rl import ALLOW, match
from smgrl.config import Config
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

        # 1. Quart's own routes (the /v1/rl catch-all is the dispatcher's: checked below).
        served: dict[str, set[str]] = {}
        for rule in gw.app.url_map.iter_rules():
            if rule.rule.startswith("/v1/rl/"):
                continue
            methods = set(rule.methods or ()) - {"OPTIONS"}
            served.setdefault(_template(rule.rule), set()).update(methods)
        non_rl = {p: m for p, m in documented.items() if not p.startswith("/v1/rl/")}
        assert non_rl == served

        # 2. The /v1/rl dispatcher: each documented template routes to one ALLOW entry, with its
        # methods, and every ALLOW entry is documented.
        rl_paths = {p: m for p, m in documented.items() if p.startswith("/v1/rl/")}
        if not rl_enabled:
            assert rl_paths == {}  # D1: a disabled control plane does not describe itself
            assert not any(r.rule.startswith("/v1/rl") for r in gw.app.url_map.iter_rules())
            return
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
    errors = (ROOT / "smgrl/errors.py").read_text()
    rl = set(re.findall(r'code, status = "([a-z_]+)", \d+', errors))
    rl |= set(
        re.findall(r'code, status = "([a-z_]+)", \d+', (ROOT / "smgrl/api/journal_routes.py").read_text())
    )
    # The docstring's table names codes that are not exceptions (upstream_error).
    rl |= set(re.findall(r"^\s+(?:│\s+)?[├└]── \w+\s+([a-z_]+)\s+\d{3}", errors, re.MULTILINE))
    rl.add("upstream_error")
    rl.add("internal_error")  # app.py's answer to a bug
    workers = set(re.findall(r"\b([A-Z][A-Z_]+[A-Z])\b\s+\d{3}", errors))
    for path in (ROOT / "smgrl").rglob("*.py"):
        text = path.read_text()
        workers |= set(re.findall(r'WorkerApiError\(\s*\d{3},\s*"([A-Z_]+)"', text))
    envelope = (ROOT / "smgrl/api/envelopes.py").read_text()
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

    def enum_values(schema_names, field="error"):
        out = set()
        for name in schema_names:
            props = schemas[name]["properties"]
            out |= set(props[field].get("enum", ()))
        return out

    rl_schemas = [n for n, s in schemas.items() if set(s.get("required", ())) >= {"error", "message"}]
    documented_rl = enum_values(rl_schemas) | set(schemas["RlFailedCall"]["properties"]["error"]["enum"])
    assert codes["rl"] <= documented_rl, codes["rl"] - documented_rl
    assert codes["workers"] <= set(schemas["WorkerApiError"]["properties"]["code"]["enum"])
    openai_documented = set(schemas["OpenAIError"]["properties"]["error"]["properties"]["code"]["enum"])
    openai_documented |= set(schemas["ApiKeyError"]["properties"]["error"]["properties"]["code"]["enum"])
    assert codes["openai"] <= openai_documented, codes["openai"] - openai_documented


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
