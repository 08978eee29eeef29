"""Control-plane auth on `/v1/rl/*` and `/workers*` (docs/rl-control-plane.md, "Auth"; D2, D3 in docs/deviations.md)."""

from __future__ import annotations

import json

from rl_api_helpers import (
    ADMIN,
    ADMIN_KEY,
    KEYS,
    TENANT_KEY,
    TENANTS,
    USER,
    USER_KEY,
    assert_json,
    assert_text,
    audit_counts,
    journal,
    rl_cfg,
    row_ids,
)

from smgrl.fake import fake_fleet
from smgrl.telemetry.audit import route_family
from smgrl.testing import gateway_in_process

CONTROL_401 = {"content-type", "content-length", "x-request-id", "www-authenticate"}
REALM = 'Bearer realm="control-plane"'
MISSING = "Missing or invalid Authorization header"
INVALID = "Invalid authentication token"
ADMIN_ONLY = "Admin role required for this control plane operation"


def matrix(wid: str, spare_url: str) -> list[tuple[str, str, dict | None, int, int]]:
    """(method, path, json body, admin status, user status). D3: every engine route is admin-only,
    GET and HEAD included (SMG 1.13.0 lets a user key run GET/HEAD engine routes)."""
    return [
        ("GET", "/v1/rl/workers", None, 200, 200),
        ("HEAD", "/v1/rl/workers", None, 200, 200),
        ("GET", f"/v1/rl/workers/{wid}", None, 200, 200),
        ("GET", "/v1/rl/journal", None, 200, 200),
        ("GET", "/workers", None, 200, 200),
        ("GET", f"/workers/{wid}", None, 200, 200),
        ("GET", f"/v1/rl/workers/{wid}/engine/server_info", None, 200, 403),
        ("HEAD", f"/v1/rl/workers/{wid}/engine/server_info", None, 200, 403),
        ("POST", f"/v1/rl/workers/{wid}/engine/flush_cache", None, 200, 403),
        ("GET", "/v1/rl/engine/flush_cache?selector=engine%3Dsglang", None, 200, 403),
        ("HEAD", "/v1/rl/engine/flush_cache?selector=engine%3Dsglang", None, 200, 403),
        ("POST", "/v1/rl/engine/flush_cache?selector=engine%3Dsglang", None, 200, 403),
        ("POST", "/workers", {"url": spare_url}, 202, 403),
        ("PATCH", f"/workers/{wid}", {"labels": {"role": "policy"}}, 202, 403),
        ("PUT", f"/workers/{wid}", {"url": "http://x:1", "labels": {}}, 202, 403),
    ]


async def test_role_matrix_and_audit_events():
    """D2: an allowed write is an individual audit event; reads and denials are counted."""
    cfg = rl_cfg(control_plane_keys=KEYS, tenant_keys=TENANTS)
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(cfg) as gw:
        (wid,) = await gw.register(fleet.urls[:1])
        fleet.clear_calls()
        await audit_counts(gw)  # start from an empty interval
        expected_counts: dict = {}
        for method, path, body, admin_status, user_status in matrix(wid, fleet.urls[1]):
            for headers, expected, principal, role in (
                (USER, user_status, "usr", "user"),
                (ADMIN, admin_status, "adm", "admin"),
            ):
                before = len(journal(gw, "audit.control_plane"))
                r = await gw.client.request(method, path, json=body, headers=headers)
                assert r.status_code == expected, (method, path, role, r.text)
                if expected == 403 and method != "HEAD":
                    assert_text(r, 403, ADMIN_ONLY, {"content-type", "content-length", "x-request-id"})
                await gw.writer.flush()
                raw_path = path.split("?")[0]
                read = method in ("GET", "HEAD") and "/engine/" not in path
                if expected == 403 or read:
                    # Counted, not journaled one by one.
                    assert journal(gw, "audit.control_plane")[before:] == []
                    key = (
                        principal,
                        route_family(raw_path),
                        "denied" if expected == 403 else "success",
                        "admin role required" if expected == 403 else None,
                    )
                    expected_counts[key] = expected_counts.get(key, 0) + 1
                    continue
                (event,) = journal(gw, "audit.control_plane")[before:]
                assert (
                    event.principal,
                    event.auth_method,
                    event.role,
                    event.method,
                    event.path,
                    event.outcome,
                    event.status,
                    event.request_id,
                ) == (
                    principal,
                    "api_key",
                    role,
                    method,
                    raw_path,
                    "success",
                    expected,
                    r.headers["x-request-id"],
                )
        assert await audit_counts(gw) == expected_counts
        # A user key never reached an engine route: the only engine calls are the admin's.
        assert [c.method for c in fleet.engines[0].calls_to("/flush_cache")] == [
            "POST",
            "GET",
            "HEAD",
            "POST",
        ]


async def test_401_texts_and_headers():
    cfg = rl_cfg(control_plane_keys=KEYS, tenant_keys=TENANTS)
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(cfg, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw, ADMIN)
        cases = [
            ({}, MISSING),
            ({"authorization": f"Basic {ADMIN_KEY}"}, MISSING),
            ({"authorization": ADMIN_KEY}, MISSING),
            ({"authorization": "Bearer"}, MISSING),
            ({"authorization": "Bearer wrong"}, INVALID),
            ({"authorization": f"Bearer {TENANT_KEY}"}, INVALID),
        ]
        for path in (
            "/v1/rl/workers",
            f"/v1/rl/workers/{wid}/engine/flush_cache",
            "/workers",
            "/v1/rl/workers/%FF",
            "/v1/rl/workers/nope/engine/a/b/c/d/e",
            "/v1/rl/engine/x?selector=a&selector=b",
        ):
            for headers, text in cases:
                r = (
                    await gw.client.post(path, headers=headers)
                    if "engine" in path
                    else await gw.client.get(path, headers=headers)
                )
                assert_text(r, 401, text, CONTROL_401)
                assert r.headers["www-authenticate"] == REALM
        # Scheme case-insensitive, extra spaces tolerated.
        for value in (f"bearer {USER_KEY}", f"BEARER   {USER_KEY}"):
            r = await gw.client.get("/v1/rl/workers", headers={"authorization": value})
            assert r.status_code == 200
        # Routing runs before auth: unknown URLs and wrong methods answer for everybody.
        r = await gw.client.get("/v1/rl/foo")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
        r = await gw.client.delete("/v1/rl/workers")
        assert r.status_code == 405 and r.headers["allow"] == "GET,HEAD"
        r = await gw.client.delete("/workers")
        assert r.status_code == 405 and r.headers["allow"] == "POST,GET,HEAD"
        await gw.writer.flush()
        assert [e for e in journal(gw, "audit.control_plane") if e.outcome == "denied"] == []
        counts = await audit_counts(gw)
        denied = {k: n for k, n in counts.items() if k[2] == "denied"}
        assert {k[0] for k in denied} == {"unauthenticated"}
        assert sum(denied.values()) == 6 * 6


async def test_tenant_keys_alone_close_the_control_plane():
    cfg = rl_cfg(tenant_keys=TENANTS)
    async with gateway_in_process(cfg) as gw:
        r = await gw.client.get("/v1/rl/workers", headers={"authorization": f"Bearer {TENANT_KEY}"})
        assert_text(r, 401, INVALID, CONTROL_401)
        r = await gw.client.get("/workers")
        assert_text(r, 401, MISSING, CONTROL_401)


async def test_api_key_mode_answers_json_401():
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_cfg(api_key=ADMIN_KEY)) as gw:
        await gw.register(fleet.urls, api_key=ADMIN_KEY)
        data_realm = 'Bearer realm="data-plane"'
        for headers, status, message, realm in (
            ({}, 401, "Missing API key: send it as `Authorization: Bearer <key>`", data_realm),
            (
                {"authorization": "x"},
                401,
                "Missing API key: send it as `Authorization: Bearer <key>`",
                data_realm,
            ),
            (
                {"authorization": "Bearer wrong"},
                401,
                "Invalid API key",
                data_realm + ', error="invalid_token"',
            ),
        ):
            for path in ("/v1/rl/workers", "/workers"):
                r = await gw.client.get(path, headers=headers)
                assert_json(
                    r,
                    status,
                    {
                        "error": {
                            "message": message,
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "invalid_api_key",
                        }
                    },
                    {"content-type", "content-length", "x-request-id", "www-authenticate"},
                )
                assert r.headers["www-authenticate"] == realm
        r = await gw.client.get("/v1/rl/workers", headers=ADMIN)
        assert r.status_code == 200


async def test_open_without_keys_and_audit_can_be_turned_off():
    async with (
        fake_fleet("sglang", 1) as fleet,
        gateway_in_process(rl_cfg(audit=False), worker_urls=fleet.urls) as gw,
    ):
        assert (await gw.client.get("/v1/rl/workers")).status_code == 200
        assert (await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")).status_code == 200
        await gw.writer.flush()
        assert journal(gw, "audit.control_plane") == []
        assert await audit_counts(gw) == {}
        assert journal(gw, "audit.control_plane_counts") == []
    async with gateway_in_process(rl_cfg()) as gw:
        r = await gw.client.get("/v1/rl/workers")
        assert r.status_code == 200
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert r.status_code == 400  # no match: still an operation, and a write
        await gw.writer.flush()
        (event,) = journal(gw, "audit.control_plane")
        assert (event.principal, event.auth_method, event.role, event.outcome, event.status) == (
            "none",
            "none",
            "admin",
            "success",
            400,
        )
        assert event.request_id == r.headers["x-request-id"]
        assert await audit_counts(gw) == {("none", "rl.discovery", "success", None): 1}


async def test_no_key_text_in_the_journal():
    cfg = rl_cfg(control_plane_keys=KEYS, tenant_keys=TENANTS)
    async with fake_fleet("sglang", 1, api_key="engine-key-123") as fleet, gateway_in_process(cfg) as gw:
        r = await gw.client.post(
            "/workers", json={"url": fleet.urls[0], "api_key": "engine-key-123"}, headers=ADMIN
        )
        assert r.status_code == 202
        await gw.wait_visible(1)
        for headers in (
            ADMIN,
            USER,
            {"authorization": f"Bearer {TENANT_KEY}"},
            {"authorization": "Bearer guessed-key"},
        ):
            await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang", headers=headers)
        listed = await gw.client.get("/workers", headers=ADMIN)
        assert "engine-key-123" not in listed.text
        await gw.writer.flush()
        dump = "\n".join(json.dumps(str(rec.event)) for rec in gw.store.read())
        for secret in ("engine-key-123", ADMIN_KEY, USER_KEY, TENANT_KEY, "guessed-key"):
            assert secret not in dump


async def test_audit_log_levels_and_long_paths(caplog):
    """Every control-plane request has its audit log line. Without any control-plane auth, an
    allowed read's line is DEBUG (a discovery poll is not INFO news); writes and every
    line of a gateway with keys stay INFO. Paths are cut in the line."""
    import logging

    caplog.set_level(logging.DEBUG, logger="smgrl.audit")

    def audit_levels() -> list[tuple[str, str]]:
        return [
            (r.levelname, r.fields["method"])
            for r in caplog.records
            if r.name == "smgrl.audit" and r.getMessage() == "control_plane_audit"
        ]

    async with gateway_in_process(rl_cfg()) as gw:
        await gw.client.get("/v1/rl/workers")
        await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert audit_levels() == [("DEBUG", "GET"), ("INFO", "POST")]
    caplog.clear()
    cfg = rl_cfg(control_plane_keys=KEYS)
    async with gateway_in_process(cfg) as gw:
        await gw.client.get("/v1/rl/workers", headers=USER)
        long_path = "/v1/rl/workers/" + "x" * 5000 + "/engine/flush_cache"
        assert (await gw.client.post(long_path)).status_code == 401
        assert audit_levels() == [("INFO", "GET"), ("INFO", "POST")]
        shown = caplog.records[-1].fields["path"]
        assert len(shown) < 600 and shown.endswith(f"...({len(long_path)} chars)")
