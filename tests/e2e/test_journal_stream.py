"""GET /v1/rl/journal/stream against a real gateway: records arrive as they commit (a refit's
events included), ``?after=`` replays without a gap or a repeat, keys are required when
configured and never accepted in the URL."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from smgrl.fake.checkpoint import make_checkpoint

pytestmark = pytest.mark.e2e
ADMIN = "stream-admin-key"


def open_stream(base: str, after: int | None = None, key: str | None = ADMIN):
    url = base + "/v1/rl/journal/stream" + (f"?after={after}" if after is not None else "")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30)


def records(resp, until, limit: int = 5000) -> list[dict]:
    """Parse SSE blocks until ``until(records)`` is true (bounded)."""
    out, event, data = [], None, ""
    for _ in range(limit):
        line = resp.readline().decode()
        if not line:
            break
        line = line.rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and event:
            if event == "journal":
                out.append(json.loads(data))
                if until(out):
                    return out
            event, data = None, ""
    raise AssertionError(f"stream ended before the condition held: {[r['type'] for r in out]}")


def test_stream_follows_commits_and_replays_after(fakes, gateway, tmp_path):
    urls = fakes("sglang", 2)
    _, http, port = gateway(
        "--enable-rl", "--disable-health-check", "--control-plane-api-keys", f"adm:admin:admin:{ADMIN}",
        "--worker-urls", *urls,
    )  # fmt: skip
    http.token = ADMIN
    base = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.HTTPError) as denied:
        open_stream(base, key=None)
    assert denied.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as in_url:
        urllib.request.urlopen(base + f"/v1/rl/journal/stream?api_key={ADMIN}", timeout=10)
    assert in_url.value.code == 401  # a key in the URL is not a key
    deadline = time.monotonic() + 30
    while len(http.request("GET", "/v1/rl/workers")[2]["workers"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    live = open_stream(base)
    ckpt = str(make_checkpoint(tmp_path / "c", "fake/model", seed=5))
    started = {}

    def start_refit():
        started["r"] = http.request(
            "POST",
            "/v1/rl/refits",
            {"selector": "engine=sglang", "source": {"disk": {"model_path": ckpt}}, "weight_version": "5"},
        )

    threading.Thread(target=start_refit).start()
    got = records(live, lambda rs: any(r["type"] == "refit.finished" for r in rs))
    live.close()
    types = [r["type"] for r in got]
    assert types[0] == "refit.started" or "refit.started" in types
    assert {"refit.step", "refit.step_done", "control.started", "control.outcome"} <= set(types)
    seqs = [r["seq"] for r in got]
    assert seqs == sorted(set(seqs))
    # Replay from the first streamed record: the same records, in order, then live.
    replay = open_stream(base, after=seqs[0] - 1)
    again = records(replay, lambda rs: rs[-1]["seq"] >= seqs[-1])
    replay.close()
    assert [r["seq"] for r in again][: len(seqs)] == list(range(seqs[0], seqs[0] + len(again)))[: len(seqs)]
    assert {r["seq"] for r in got} <= {r["seq"] for r in again}
    # ?tail=N: the last N records, then live.
    resp = urllib.request.urlopen(
        urllib.request.Request(
            base + "/v1/rl/journal/stream?tail=3", headers={"authorization": f"Bearer {ADMIN}"}
        ),
        timeout=30,
    )
    head = max(r["seq"] for r in again)
    last3 = records(resp, lambda rs: len(rs) >= 3)
    resp.close()
    assert last3[0]["seq"] >= head - 2
