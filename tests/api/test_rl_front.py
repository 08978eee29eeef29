"""Discovery answered by the raw front (smgrl/api/rl_front.py) is the answer Quart gives, byte
for byte and audit for audit; every other outcome is still Quart's."""

from __future__ import annotations

import logging

from rl_api_helpers import ADMIN, KEYS, USER, audit_counts, rl_cfg

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
