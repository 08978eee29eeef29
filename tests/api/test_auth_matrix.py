"""The auth matrix (docs/rl-control-plane.md, "Auth"; D3 in docs/deviations.md) as ONE table: every route x every credential x every auth mode.

Credentials (columns, in this order):

    none   no Authorization header
    bad    a malformed header: the admin key itself, without the `Bearer` scheme
    wrong  `Bearer <a key nobody configured>`
    tenant `Bearer <a --tenant-api-key key>` (data plane only)
    worker `Bearer <a worker's registration api_key>` (what the gateway sends TO the engine)
    user   `Bearer <a user-role control-plane key>`
    admin  `Bearer <an admin-role control-plane key>`
    apikey `Bearer <the --api-key>`

Auth modes (one expected-status string per mode, credentials in the order above):

    cp      --control-plane-api-keys (admin + user) with --tenant-api-key and --api-key also set:
            only the control-plane keys count; 401s are text/plain, realm control-plane
    apikey  --api-key (+ --tenant-api-key), no control-plane keys: that key is the bearer for
            everything; 401s are the JSON invalid_api_key envelope, realm data-plane
    tenant  --tenant-api-key only: the control plane is closed (401 for everyone)
    open    no keys at all: development mode, everything allowed

Routing runs before auth (404/405 for everybody), probes, /openapi.json and /docs need no key, `user`
reads discovery, the journal routes and GET /workers, every engine route needs `admin` whatever
the method (D3), and no refused request ever reaches an engine.
"""

from __future__ import annotations

import itertools

import pytest
from rl_api_helpers import ADMIN_KEY, KEYS, TENANT_KEY, TENANTS, USER_KEY, rl_cfg

from smgrl.demo.procs import free_port
from smgrl.fake import fake_fleet
from smgrl.registry.service import Registration
from smgrl.testing import gateway_in_process

WORKER_KEY = "worker-secret-7"
API_KEY = "shared-api-key-9"
CREDENTIALS = {
    "none": None,
    "bad": ADMIN_KEY,
    "wrong": "Bearer not-a-configured-key",
    "tenant": f"Bearer {TENANT_KEY}",
    "worker": f"Bearer {WORKER_KEY}",
    "user": f"Bearer {USER_KEY}",
    "admin": f"Bearer {ADMIN_KEY}",
    "apikey": f"Bearer {API_KEY}",
}
MODES = {
    "cp": {"control_plane_keys": KEYS, "tenant_keys": TENANTS, "api_key": API_KEY},
    "apikey": {"tenant_keys": TENANTS, "api_key": API_KEY},
    "tenant": {"tenant_keys": TENANTS},
    "open": {},
}
FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"
ALL_401 = "401 401 401 401 401 401 401 401"

# (method, path, expected per mode) -- credentials:  none bad wrong tenant worker user admin apikey
TABLE = [
    # probes and the API description: no key needed
    ("GET", "/health", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    ("HEAD", "/health", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    ("GET", "/liveness", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    ("GET", "/readiness", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    ("GET", "/openapi.json", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    ("GET", "/docs", {m: "200 200 200 200 200 200 200 200" for m in MODES}),
    # discovery: read
    (
        "GET",
        "/v1/rl/workers",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/v1/rl/workers",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "GET",
        "/v1/rl/workers/{wid}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/v1/rl/workers/{wid}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    # engine routes: admin only, whatever the method (D3)
    (
        "GET",
        "/v1/rl/workers/{wid}/engine/server_info",
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/v1/rl/workers/{wid}/engine/server_info",
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "POST",
        "/v1/rl/workers/{wid}/engine/flush_cache",
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "GET",
        FANOUT,
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        FANOUT,
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "POST",
        FANOUT,
        {
            "cp": "401 401 401 401 401 403 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    # journal routes: read
    (
        "GET",
        "/v1/rl/operations/{op}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/v1/rl/operations/{op}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "GET",
        "/v1/rl/journal",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/v1/rl/journal",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    # the worker registry: GET is a read, the rest are writes
    (
        "GET",
        "/workers",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/workers",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "POST",
        "/workers",
        {
            "cp": "401 401 401 401 401 403 202 401",
            "apikey": "401 401 401 401 401 401 401 202",
            "tenant": ALL_401,
            "open": "202 202 202 202 202 202 202 202",
        },
    ),
    (
        "GET",
        "/workers/{wid}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "HEAD",
        "/workers/{wid}",
        {
            "cp": "401 401 401 401 401 200 200 401",
            "apikey": "401 401 401 401 401 401 401 200",
            "tenant": ALL_401,
            "open": "200 200 200 200 200 200 200 200",
        },
    ),
    (
        "PUT",
        "/workers/{wid}",
        {
            "cp": "401 401 401 401 401 403 202 401",
            "apikey": "401 401 401 401 401 401 401 202",
            "tenant": ALL_401,
            "open": "202 202 202 202 202 202 202 202",
        },
    ),
    (
        "PATCH",
        "/workers/{wid}",
        {
            "cp": "401 401 401 401 401 403 202 401",
            "apikey": "401 401 401 401 401 401 401 202",
            "tenant": ALL_401,
            "open": "202 202 202 202 202 202 202 202",
        },
    ),
    (
        "DELETE",
        "/workers/{victim}",
        {
            "cp": "401 401 401 401 401 403 202 401",
            "apikey": "401 401 401 401 401 401 401 202",
            "tenant": ALL_401,
            "open": "202 202 202 202 202 202 202 202",
        },
    ),
    # routing runs before auth: unknown routes and wrong methods answer the same to everybody
    ("GET", "/v1/rl/nope", {m: "404 404 404 404 404 404 404 404" for m in MODES}),
    ("GET", "/v1/rl/engine/", {m: "404 404 404 404 404 404 404 404" for m in MODES}),
    ("PUT", "/v1/rl/workers", {m: "405 405 405 405 405 405 405 405" for m in MODES}),
    ("DELETE", "/v1/rl/engine/flush_cache", {m: "405 405 405 405 405 405 405 405" for m in MODES}),
    ("POST", "/v1/rl/journal", {m: "405 405 405 405 405 405 405 405" for m in MODES}),
    ("DELETE", "/workers", {m: "405 405 405 405 405 405 405 405" for m in MODES}),
    ("POST", "/health", {m: "405 405 405 405 405 405 405 405" for m in MODES}),
    ("GET", "/nope", {m: "404 404 404 404 404 404 404 404" for m in MODES}),
]

DENIED_TEXT = {
    401: ("Missing or invalid Authorization header", "Invalid authentication token"),
    403: ("Admin role required for this control plane operation",),
}


def _is_engine(path: str) -> bool:
    return "/engine/" in path and not path.endswith("/engine/")


def _check_denied(mode: str, method: str, status: int, r) -> None:
    """The refusal envelopes: text/plain in the control-plane modes, JSON with --api-key only."""
    if mode == "apikey" and status == 401:
        assert r.headers["content-type"] == "application/json"
        assert r.headers["www-authenticate"].startswith('Bearer realm="data-plane"')
        if method != "HEAD":
            assert r.json()["error"]["code"] == "invalid_api_key"
        return
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    if status == 401:
        assert r.headers["www-authenticate"] == 'Bearer realm="control-plane"'
    if method != "HEAD":
        assert r.text in DENIED_TEXT[status]


@pytest.mark.parametrize("mode", list(MODES))
async def test_auth_matrix(mode):
    cfg = rl_cfg(**MODES[mode])
    admin_cred = {"cp": "admin", "apikey": "apikey", "open": "none", "tenant": None}[mode]
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(cfg) as gw:
        (wid,) = await gw.register(fleet.urls, api_key=WORKER_KEY)
        spare = itertools.count()
        closed = free_port()  # nothing listens there: registrations to it stay pending, on loopback

        op = "0198a7b2-0000-7000-8000-000000000000"
        if admin_cred is not None:
            cred = CREDENTIALS[admin_cred]
            r = await gw.client.post(FANOUT, headers={"authorization": cred} if cred else {})
            assert r.status_code == 200
            op = r.headers["x-smgrl-operation-id"]
        fleet.clear_calls()
        engine_requests_allowed = 0
        problems = []
        for method, template, expected in TABLE:
            statuses = [int(s) for s in expected[mode].split()]
            assert len(statuses) == len(CREDENTIALS), (method, template)
            for (name, header), status in zip(CREDENTIALS.items(), statuses):
                params = {"wid": wid, "op": op}
                if "{victim}" in template:
                    victim = await gw.gateway.registry.register(
                        Registration(url=f"http://127.0.0.1:{closed}/victim{next(spare)}"), "api"
                    )
                    params["victim"] = victim.id
                path = template.format(**params)
                body = None
                if method == "POST" and path == "/workers":
                    body = {"url": f"http://127.0.0.1:{closed}/new{next(spare)}"}
                elif method in ("PUT", "PATCH"):
                    body = {"url": "http://127.0.0.1:1", "labels": {"role": "policy"}}
                r = await gw.client.request(
                    method, path, json=body, headers={"authorization": header} if header else {}
                )
                if r.status_code != status:
                    problems.append((mode, name, method, path, status, r.status_code, r.text[:120]))
                    continue
                assert r.headers["x-request-id"]
                if status in (401, 403):
                    _check_denied(mode, method, status, r)
                elif status in (404, 405) and method != "HEAD":
                    assert r.json()["error"]["code"] in ("unknown_url", "method_not_allowed")
                if _is_engine(path) and status == 200:
                    engine_requests_allowed += 1
        assert problems == [], "\n".join(map(str, problems))

        # No refused request reached an engine: the engine saw exactly the allowed calls.
        engine_calls = [c for c in fleet.engines[0].calls if c.path in ("/server_info", "/flush_cache")]
        assert len(engine_calls) == engine_requests_allowed
        if mode in ("cp", "apikey"):
            assert engine_requests_allowed == 6  # one credential passes each of the 6 engine rows
        # The worker key travels only from the gateway to the engine, as the bearer.
        assert {c.headers.get("authorization") for c in engine_calls} <= {f"Bearer {WORKER_KEY}"}
