"""What a control operation logs (docs/deviations.md, "log lines of a fan-out"): one INFO
``rl.fanout`` line per fan-out, an engine's ``rl.proxy`` line at INFO only when it refused, every
engine's line at DEBUG; a per-worker call keeps its ``rl.proxy`` line at INFO."""

from __future__ import annotations

import logging

from rl_api_helpers import op_events, rl_cfg, row_ids

from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"


def _lines(caplog, level: int = logging.DEBUG) -> list[tuple[str, str, dict]]:
    return [
        (r.levelname, r.getMessage(), r.fields)
        for r in caplog.records
        if r.name == "smgrl.rl" and r.levelno >= level
    ]


async def test_a_fanout_logs_one_info_line_and_each_engine_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="smgrl.rl")
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        ids = await row_ids(gw)
        caplog.clear()
        r = await gw.client.post(FANOUT)
        assert r.status_code == 200
        op_id = r.headers["x-smgrl-operation-id"]
        info = _lines(caplog, logging.INFO)
        assert [(level, msg) for level, msg, _ in info] == [("INFO", "rl.fanout")]
        assert info[0][2]["op_id"] == op_id
        assert (info[0][2]["total"], info[0][2]["succeeded"], info[0][2]["failed"]) == (3, 3, 0)
        debug = [fields["worker_id"] for level, msg, fields in _lines(caplog) if msg == "rl.proxy"]
        assert sorted(debug) == sorted(ids)
        # What the INFO line no longer says per engine, the journal does.
        outcomes = [e for e in op_events(gw, op_id) if type(e).__name__ == "ControlOutcome"]
        assert sorted(o.worker_id for o in outcomes) == sorted(ids)

        # An engine that refuses still gets its own INFO line.
        fleet.engines[0].set_knobs(force_status=500, force_body='{"error": "no"}')
        caplog.clear()
        r = await gw.client.post(FANOUT)
        assert r.status_code == 207
        info = _lines(caplog, logging.INFO)
        assert sorted(msg for _, msg, _ in info) == ["rl.fanout", "rl.proxy"]
        refused = next(fields for _, msg, fields in info if msg == "rl.proxy")
        assert refused["status"] == 500 and refused["url"] == fleet.engines[0].url


async def test_a_per_worker_call_keeps_its_info_line(caplog):
    caplog.set_level(logging.INFO, logger="smgrl.rl")
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        caplog.clear()
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert r.status_code == 200
        assert [(level, msg, fields["worker_id"]) for level, msg, fields in _lines(caplog)] == [
            ("INFO", "rl.proxy", wid)
        ]
