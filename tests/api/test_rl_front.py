"""Discovery answered by the raw front (smgrl/http/fronts/rl_front.py) is the answer Quart gives, byte
for byte and audit for audit; every other outcome is still Quart's."""

from __future__ import annotations

import logging

import attrs
from rl_api_helpers import ADMIN, KEYS, USER, audit_counts, body_of, journal, ordered, rl_cfg

from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process


def _audit_lines(caplog) -> list[dict]:
    return [
        {k: v for k, v in r.fields.items() if k != "request_id"} | {"level": r.levelname}
        for r in caplog.records
        if r.name == "smgrl.audit" and r.getMessage() == "control_plane_audit"
    ]


async def test_discovery_skips_quart_and_answers_exactly_as_quart_does(caplog):
    caplog.set_level(logging.DEBUG, logger="smgrl.audit")
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(rl_cfg(control_plane_keys=KEYS), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(2)
        quart_requests = []

        @gw.app.before_request
        async def _count() -> None:
            quart_requests.append(1)

        for method in ("GET", "HEAD"):
            for key in (USER, ADMIN):
                for extra in ({"x-request-id": "mine"}, {"x-correlation-id": "corr-1"}, {}):
                    headers = {**key, **extra}
                    caplog.clear()
                    raw = await gw.client.request(method, "/v1/rl/workers", headers=headers)
                    assert quart_requests == []  # the raw front answered
                    raw_audit = _audit_lines(caplog)
                    caplog.clear()
                    # A request that declares a body always goes to Quart: the reference answer.
                    quart = await gw.client.request(
                        method, "/v1/rl/workers", headers={**headers, "content-length": "0"}
                    )
                    assert quart_requests.pop() == 1
                    assert (raw.status_code, raw.content) == (quart.status_code, quart.content)
                    assert raw.status_code == 200 and (method == "HEAD") == (raw.content == b"")
                    same = {k: v for k, v in raw.headers.items() if k != "x-request-id"}
                    assert same == {k: v for k, v in quart.headers.items() if k != "x-request-id"}
                    rid, qrid = raw.headers["x-request-id"], quart.headers["x-request-id"]
                    if extra:
                        assert rid == qrid == next(iter(extra.values()))
                    else:
                        assert rid.startswith("req-") and len(rid) == len(qrid)
                    assert raw_audit == _audit_lines(caplog) and len(raw_audit) == 1
        counts = await audit_counts(gw)
        assert sum(n for (_, family, outcome, _), n in counts.items() if outcome == "success") == 24

        # Refusals and everything else are Quart's.
        assert (await gw.client.get("/v1/rl/workers")).status_code == 401
        assert (await gw.client.post("/v1/rl/workers", headers=USER)).status_code == 405
        assert len(quart_requests) == 2


# -- engine routes (EngineFront) -------------------------------------------------------------------

VOLATILE = {"op_id", "request_id", "latency_ms", "ts"}


def _masked(event) -> dict:
    return {k: ("<v>" if k in VOLATILE else v) for k, v in attrs.asdict(event).items()}


def _new_events(gw, before: int) -> list[str]:
    """The events journaled since ``before`` (outcomes arrive in any order: sorted)."""
    return sorted(f"{type(e).__name__} {_masked(e)}" for e in journal(gw)[before:])


def _engine_calls(fleet, rid: str = "") -> list[tuple]:
    """What the engines received since the last call (the response's request id masked)."""
    calls = []
    for engine in fleet.engines:
        for c in engine.calls:
            headers = {
                k: ("<rid>" if v == rid else v)
                for k, v in c.headers.items()
                if k in ("x-request-id", "traceparent", "content-type")
            }
            calls.append((engine.url, c.method, c.path, c.query, c.body, sorted(headers.items())))
        engine.clear_calls()
    return sorted(calls)


async def _chunked(body: bytes):
    yield body  # a body of undeclared length: EngineFront leaves it to Quart


async def test_engine_routes_skip_quart_and_answer_exactly_as_quart_does(caplog):
    """Fan-outs and per-worker calls through the raw front: the same status, body (in wire
    order), headers, engine calls, journal records and audit lines as Quart's route gives."""
    caplog.set_level(logging.DEBUG, logger="smgrl.audit")
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(rl_cfg(control_plane_keys=KEYS), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(3)
        rows = sorted(gw.gateway.fleet.registry, key=lambda w: w.base_url)
        failing = next(e for e in fleet.engines if e.url == rows[2].base_url)
        failing.set_knobs(force_status=500, force_body='{"x":1}')
        quart_requests = []

        @gw.app.before_request
        async def _count() -> None:
            quart_requests.append(1)

        _engine_calls(fleet)  # forget registration's probes
        sel = "selector=engine%3Dsglang"
        long_id = "x" * 200  # over 128 characters: replaced by a generated id, which is forwarded
        cases = [
            ("POST", f"/v1/rl/engine/flush_cache?{sel}", b"", {}),
            ("POST", f"/v1/rl/engine/update_weights?{sel}&a=1", b'{"a": 1}', {"x-request-id": "mine"}),
            ("GET", f"/v1/rl/engine/get_server_info?{sel}", b"", {"traceparent": "00-ab-cd-01"}),
            ("POST", f"/v1/rl/engine//v1/x?{sel}", b"{}", {"content-type": "text/x"}),
            ("POST", f"/v1/rl/workers/{rows[0].id}/engine/flush_cache", b'{"b": 2}', {}),
            (
                "GET",
                f"/v1/rl/workers/{rows[1].id}/engine/get_model_info?q=%20",
                b"",
                {"x-request-id": long_id},
            ),
            ("POST", f"/v1/rl/workers/{rows[2].id}/engine/flush_cache", b"", {"x-correlation-id": "c"}),
        ]
        for method, url, body, extra in cases:
            for key in (ADMIN, USER):
                headers = {**key, **extra}
                caplog.clear()
                before = len(journal(gw))
                raw = await gw.client.request(method, url, content=body, headers=headers)
                raw_quart = len(quart_requests)
                raw_audit, raw_events = _audit_lines(caplog), _new_events(gw, before)
                raw_calls = _engine_calls(fleet, raw.headers["x-request-id"])
                caplog.clear()
                before = len(journal(gw))
                quart = await gw.client.request(method, url, content=_chunked(body), headers=headers)
                assert len(quart_requests) == raw_quart + 1  # the reference went through Quart
                quart_events = _new_events(gw, before)
                quart_calls = _engine_calls(fleet, quart.headers["x-request-id"])
                where = (method, url, key is ADMIN)
                assert (raw.status_code, raw.headers.get("content-type")) == (
                    quart.status_code,
                    quart.headers.get("content-type"),
                ), where
                if raw.content and raw.headers["content-type"] == "application/json":
                    assert ordered(body_of(raw)) == ordered(body_of(quart)), where
                else:
                    assert raw.content == quart.content, where
                # The bodies carry latencies: their lengths may differ by a digit.
                assert raw.headers["content-length"] == str(len(raw.content)), where
                volatile = ("x-request-id", "x-smgrl-operation-id", "content-length")
                assert {k: v for k, v in raw.headers.items() if k not in volatile} == {
                    k: v for k, v in quart.headers.items() if k not in volatile
                }, where
                assert set(raw.headers) == set(quart.headers), where
                rid = raw.headers["x-request-id"]
                if extra.get("x-request-id") == "mine" or "x-correlation-id" in extra:
                    assert rid == quart.headers["x-request-id"] == next(iter(extra.values()))
                assert raw_calls == quart_calls, where
                assert _audit_lines(caplog) == raw_audit and len(raw_audit) == 1, where
                assert raw_events == quart_events, where
            assert quart_requests.count(1) >= 1
        # Allowed calls (the admin's) never reached Quart through the front; the user's were
        # refused (403) by Quart both times.
        assert len(quart_requests) == len(cases) * 3
