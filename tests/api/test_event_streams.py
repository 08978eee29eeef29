"""Server-sent event streams are bounded (smgrl/http/routes/event_streams.py) and a stream holds little.

Found against a live gateway: 1,000 idle ``GET /v1/rl/journal/stream`` readers took a control
call's p90 from 13 ms to 1.9 s (every commit is pushed to every subscriber), and 40 readers of
``?after=0`` that read nothing held 120 MB (the whole backfill was read into memory at once).
The streams run for ever, so they are driven as ASGI calls on the app itself (httpx's ASGI
transport waits for the end of a body)."""

from __future__ import annotations

import json

import attrs
import trio
from asgi_call import AsgiCall
from rl_api_helpers import rl_cfg

from smgrl.fake import fake_fleet
from smgrl.fake.checkpoint import make_checkpoint
from smgrl.testing import gateway_in_process


def Stream(app, path: str) -> AsgiCall:
    return AsgiCall(app, path)


async def test_event_streams_are_bounded_and_a_closed_one_frees_its_slot(tmp_path):
    ckpt = str(make_checkpoint(tmp_path / "step-7", "fake/model", seed=7))
    config = attrs.evolve(rl_cfg(), max_event_streams=2)
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        r = await gw.client.post(
            "/v1/rl/refits",
            json={
                "selector": "engine=sglang",
                "source": {"disk": {"model_path": ckpt}},
                "weight_version": "5",
            },
        )
        assert r.status_code == 202, r.text
        refit_id = r.json()["refit_id"]
        async with trio.open_nursery() as nursery:
            first, second = (
                Stream(gw.app, "/v1/rl/journal/stream"),
                Stream(gw.app, "/v1/rl/journal/stream?after=0"),
            )
            for s in (first, second):
                await nursery.start(s.run)
                await s.wait_for(lambda s: b"event: hello" in s.body)  # running: counted
            for path in ("/v1/rl/journal/stream", f"/v1/rl/refits/{refit_id}/events"):
                with trio.fail_after(20):  # an admitted journal stream would never end
                    refused = await gw.client.get(path)
                assert refused.status_code == 429, (path, refused.text)
                assert refused.json()["error"] == "too_many_streams"
            first.gone.set()  # the client leaves: its slot comes back
            with trio.fail_after(20):
                while True:
                    r = await gw.client.get(f"/v1/rl/refits/{refit_id}/events")  # ends with the refit
                    if r.status_code != 429:
                        break
                    await trio.sleep(0.01)
            assert r.status_code == 200
            records = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
            assert records[-1]["refit_id"] == refit_id
            second.gone.set()
            nursery.cancel_scope.cancel()
        assert gw.gateway.tail.subscribers == 0


async def test_a_backfill_read_page_by_page_sends_every_record_once_in_order(tmp_path, monkeypatch):
    # The backfill is read in pages (a reader that reads nothing holds one page, not the whole
    # backfill): across page boundaries no record is lost or repeated.
    from smgrl.http.routes import stream as stream_module

    monkeypatch.setattr(stream_module, "BACKFILL_PAGE", 5)
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        for _ in range(4):
            assert (
                await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
            ).status_code == 200
        total = gw.gateway.fleet.last_seq
        assert total > 20
        async with trio.open_nursery() as nursery:
            s = Stream(gw.app, "/v1/rl/journal/stream?after=0")
            await nursery.start(s.run)
            await s.wait_for(lambda s: s.body.count(b"event: journal") >= total)
            seqs = [
                json.loads(line[6:])["seq"]
                for line in s.body.decode().splitlines()
                if line.startswith('data: {"seq"')
            ]
            assert seqs == list(range(1, total + 1))  # every record once, in order, across pages
            s.gone.set()
            nursery.cancel_scope.cancel()
