"""``smgrl launch --workers 2``: a session, or a distributed refit's trainer hand-off, used through
the process that does not hold it is forwarded to the one that does (docs/scale-out.md,
"Forwarding"). Each worker is addressed deterministically through its private loopback URL
(journaled in ``gateway.peer``), and through the shared port with a new connection per request.
SIGKILL the owner: a clear 410 ``session_gone``, nothing journaled lost, the chain verifies.

Bounded: every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import pytest
from test_workers import journal_events, request, start_supervisor, wait_until

from journal import SqliteStore
from smgrl.tito.testkit import make_model_dir

pytestmark = pytest.mark.e2e


def say(text: str) -> str:
    return f"[[fake-say:1:{json.dumps(text)}]]"


def turn(n: int, stream: bool = False) -> dict:
    body = {"messages": [{"role": "user", "content": f"turn {n} " + say(f"answer {n}")}], "max_tokens": 40}
    if stream:
        body["stream"] = True
    return body


def raw_post(base: str, path: str, body: dict, headers=None, timeout: float = 30):
    """POST on a new connection; (status, headers, body text)."""
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def peers(journal: str, count: int = 2):
    """The workers' ``gateway.peer`` events (identity -> private URL), once both journaled one."""
    return wait_until(
        f"{count} gateway.peer events",
        lambda: (
            found
            if len(found := [r.event for r in journal_events(journal) if r.event.TYPE == "gateway.peer"])
            >= count
            else None
        ),
    )


def start(fakes, children, tmp_path, *extra):
    tok = make_model_dir(tmp_path / "tok")
    urls = fakes("sglang", 2, "--tokenizer-path", str(tok), "--weight-version", "1")
    journal = str(tmp_path / "j.db")
    _, base, _, pids, _ = start_supervisor(
        children,
        tmp_path,
        journal,
        "--enable-rl",
        "--disable-health-check",
        "--tokenizer-path",
        str(tok),
        "--worker-urls",
        *urls,
        *extra,
    )
    a, b = peers(journal)
    for peer in (a, b):
        wait_until(
            "both engines visible in every worker",
            lambda peer=peer: len(request(peer.url, "GET", "/v1/rl/workers")[2]["workers"]) == 2,
        )
    return journal, base, pids, a, b


def test_a_session_is_served_by_either_worker_and_is_gone_when_its_owner_is_killed(fakes, children, tmp_path):
    journal, base, pids, a, b = start(fakes, children, tmp_path)
    st, _, body = request(a.url, "POST", "/sessions")
    assert st == 201, body
    sid = body["session_id"]
    assert sid.startswith(a.owner + "-")
    # Through the other worker: a turn, and a streamed turn.
    st, _, text = raw_post(b.url, f"/sessions/{sid}/v1/chat/completions", turn(1))
    assert st == 200, text
    assert json.loads(text)["choices"][0]["message"]["content"] == "answer 1"
    st, headers, text = raw_post(b.url, f"/sessions/{sid}/v1/chat/completions", turn(2, stream=True))
    assert st == 200 and headers["content-type"].startswith("text/event-stream"), text
    assert "answer 2" in text and text.rstrip().endswith("data: [DONE]")
    # Through the shared port, a new connection each: whichever worker accepts it serves it.
    for n in range(3, 11):
        st, _, text = raw_post(base, f"/sessions/{sid}/v1/chat/completions", turn(n, stream=n % 2 == 0))
        assert st == 200, text
    st, _, snap = request(b.url, "GET", f"/sessions/{sid}")
    assert st == 200 and sum(len(t["records"]) for t in snap["trajectories"]) == 10, snap

    # SIGKILL the owner: its session is gone, said clearly by the survivor; nothing lost.
    owner_pid = int(a.gateway.split(":")[1])
    assert owner_pid in pids
    os.kill(owner_pid, signal.SIGKILL)
    st, headers, text = raw_post(b.url, f"/sessions/{sid}/v1/chat/completions", turn(11))
    assert st == 410 and headers["x-smg-error-code"] == "session_gone", text
    assert "does not answer" in json.loads(text)["error"]["message"]
    turns = [r.event for r in journal_events(journal) if r.event.TYPE == "session.turn"]
    assert [t.turn for t in turns if t.session_id == sid] == list(range(1, 11))
    with SqliteStore.open(journal, readonly=True) as store:
        assert store.verify().ok


def test_a_distributed_refit_commit_on_the_other_worker_reaches_the_saga(fakes, children, tmp_path):
    journal, base, _, a, b = start(fakes, children, tmp_path)
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    st, _, body = request(
        a.url, "POST", "/v1/rl/refits", {"selector": "engine=sglang", "source": source, "weight_version": "2"}
    )
    assert st == 202, body
    rid = body["refit_id"]
    wait_until(
        "awaiting_transfer",
        lambda: request(a.url, "GET", f"/v1/rl/refits/{rid}")[2]["state"] == "awaiting_transfer",
    )
    chunk = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 2]]}
    st, _, body = request(b.url, "POST", f"/v1/rl/refits/{rid}/transfer", chunk)
    assert st == 200 and {x["result"] for x in body["results"]} == {"ok"}, body
    st, _, body = request(b.url, "POST", f"/v1/rl/refits/{rid}/commit", {})
    assert st == 202, body

    def finished():
        record = request(base, "GET", f"/v1/rl/refits/{rid}")[2]
        return record if record["result"] else None

    done = wait_until("the refit to finish", finished)
    assert done["result"] == "succeeded", done
    started = next(r.event for r in journal_events(journal) if r.event.TYPE == "refit.started")
    assert started.gateway == a.gateway
    with SqliteStore.open(journal, readonly=True) as store:
        assert store.verify().ok


def test_the_driver_of_a_distributed_refit_is_killed_mid_transfer_and_the_new_driver_commits(
    fakes, children, tmp_path
):
    """SIGKILL the process driving a distributed refit while it waits for the trainer (one chunk
    already sent): the supervisor restarts it, the recovery lease's holder resumes the saga and
    waits for the trainer again (no chunk was cut short); the trainer's next chunk and its commit,
    retried through the other worker while they answer 503 ``refit_driver_unavailable``, reach
    the new driver and the refit succeeds."""
    journal, _, _, a, b = start(fakes, children, tmp_path)
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    st, _, body = request(
        a.url, "POST", "/v1/rl/refits", {"selector": "engine=sglang", "source": source, "weight_version": "2"}
    )
    assert st == 202, body
    rid = body["refit_id"]
    wait_until(
        "awaiting_transfer",
        # B may not have caught up with A's refit.started yet (404 until it has): a bounded lag.
        lambda: (
            (r := request(b.url, "GET", f"/v1/rl/refits/{rid}"))[0] == 200
            and r[2]["state"] == "awaiting_transfer"
        ),
    )
    chunk = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 2]]}
    st, _, body = request(b.url, "POST", f"/v1/rl/refits/{rid}/transfer", chunk)
    assert st == 200 and {x["result"] for x in body["results"]} == {"ok"}, body
    os.kill(int(a.gateway.split(":")[1]), signal.SIGKILL)

    def retried(action: str, payload: dict):
        """The trainer's retry loop: again while the driver is unavailable (bounded)."""

        def once():
            st, _, text = raw_post(b.url, f"/v1/rl/refits/{rid}/{action}", payload)
            if st == 503 and json.loads(text)["error"] == "refit_driver_unavailable":
                return None
            return st, text

        return wait_until(f"{action} past the driver's takeover", once, timeout=40)

    st, text = retried("transfer", {"names": ["v"], "dtypes": ["float32"], "shapes": [[2]]})
    assert st == 200 and {x["result"] for x in json.loads(text)["results"]} == {"ok"}, text
    st, text = retried("commit", {})
    assert st == 202, text

    def finished():
        record = request(b.url, "GET", f"/v1/rl/refits/{rid}")[2]
        return record if record["result"] else None

    done = wait_until("the refit to finish", finished)
    assert done["result"] == "succeeded", done
    resumed = [
        r.event
        for r in journal_events(journal)
        if r.event.TYPE == "refit.state" and r.event.state == "recovering" and r.event.refit_id == rid
    ]
    # The recovery lease's holder resumed it: the surviving worker, or the dead one's restart.
    assert len(resumed) == 1 and resumed[0].gateway not in (None, a.gateway), resumed
    with SqliteStore.open(journal, readonly=True) as store:
        assert store.verify().ok
