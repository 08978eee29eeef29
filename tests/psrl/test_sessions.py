"""PSRL's session path against smgrl: a SessionRouter-style client (the calls of PSRL 19c0474
psrl/workers/gen/session_router.py: sessions created at ``POST /tito/sessions`` with no headers,
every turn a ``POST /v1/chat/completions`` carrying ``x-smg-tito-session-id`` and the routing
headers the session and its last answer gave), and an agent talking to smgrl's own
``/sessions/{sid}/v1`` as PSRL's session agent loop points agents at it.

Two fake SGLang engines, published at different versions (instance "0" at 1, "1" at 5)."""

from __future__ import annotations

import pytest

from smgrl.tito.testkit import make_model_dir
from tests.psrl.conftest import register_psrl, start_fleet

MODEL = "fake/Qwen3-0.6B"
HOP = {"host", "content-length", "connection", "transfer-encoding"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sessions")
    tok = make_model_dir(tmp / "tok")
    f = start_fleet(
        tmp,
        "sglang",
        2,
        ["--tokenizer-path", str(tok), "--weight-version", "0"],
        ["--tokenizer-path", str(tok)],
    )
    try:
        f.ids = register_psrl(f, model=MODEL, runtime="sglang")
        f.wait(lambda: len(f.instances()) == 2, what="two instances")
        versions = [
            {"worker_id": f.ids[0], "weight_version": 1},
            {"worker_id": f.ids[1], "weight_version": 5},
        ]
        published = f.client.post("/workers/update_weight_version", json=versions).json()
        assert published["updated"] == 2, published
        yield f
    finally:
        f.stop()


class SessionRouterCalls:
    """The HTTP calls PSRL's SessionRouter makes for one session, in its order."""

    ALLOWED = ("x-prompt-id", "x-request-id", "x-is-validate", "x-is-sticky", "x-version-tag",
               "x-base-worker-id", "x-target-dp-rank")  # fmt: skip

    def __init__(self, fleet, headers: dict[str, str]):
        """PSRL 19c0474 psrl/workers/gen/session_router.py:132 (``POST tito/sessions``, no
        headers, no body) and :139 (the allow-listed headers become the session's defaults)."""
        self.client = fleet.client
        r = self.client.post("/tito/sessions")
        assert r.status_code == 201, r.text
        self.sid = r.json()["session_id"]
        self.defaults = {k.lower(): v for k, v in headers.items() if k.lower() in self.ALLOWED}
        self.defaults["x-smg-tito-session-id"] = self.sid
        self.instance: tuple[str, str] | None = None
        self.version_tag: str | None = None
        self.pin_once: tuple[str, str] | None = None

    def turn(self, messages, headers=None):
        """PSRL 19c0474 psrl/workers/gen/session_router.py:199-222 (header assembly: defaults,
        the request's own headers, the recorded instance and version tag, a one-shot pin) and
        :238-247 (what it records from the answer)."""
        out = dict(self.defaults)
        out.update({k.lower(): v for k, v in (headers or {}).items() if k.lower() not in HOP})
        out.setdefault("x-smg-tito-trajectory-id", "0")
        if self.instance is not None:
            out["x-base-worker-id"], out["x-target-dp-rank"] = self.instance
        if self.version_tag is not None:
            out["x-version-tag"] = self.version_tag
        pin, self.pin_once = self.pin_once, None
        if pin is not None:
            out["x-base-worker-id"], out["x-target-dp-rank"] = pin
            out["x-force-pin-once"] = "true"
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "logprobs": True, "top_logprobs": 1}
        r = self.client.post("/v1/chat/completions", json=body, headers=out)
        if r.status_code < 400:
            base, rank = r.headers.get("x-base-worker-id"), r.headers.get("x-target-dp-rank")
            if base is not None and rank is not None:
                self.instance = (base, rank)
            if r.headers.get("x-version-tag") is not None:
                self.version_tag = r.headers["x-version-tag"]
        return r

    def served(self, r) -> str:
        assert r.status_code == 200, r.text
        return r.headers["x-base-worker-id"]


def agent_headers(uid: int, *, version_tag=0, sticky=False, instance=None) -> dict[str, str]:
    """PSRL 19c0474 psrl/workers/agent_loop/loops/session_agent_loop.py:46 (the session's
    headers: request and prompt ids, version tag, validate flag, sticky, instance)."""
    h = {"x-request-id": str(uid), "x-prompt-id": str(uid), "x-version-tag": str(version_tag),
         "x-is-validate": "false", "x-is-sticky": str(sticky).lower()}  # fmt: skip
    if instance is not None:
        h["x-base-worker-id"], h["x-target-dp-rank"] = instance[0], str(instance[1])
    return h


def conversation(n: int) -> list[dict]:
    return [{"role": "user", "content": f"question {n}"}]


def test_a_turn_floor_sent_per_turn_binds(fleet):
    """The floor arrives with the turn (the session was created with no headers): a turn with
    ``x-version-tag: 5`` is served only by the instance at 5 or newer."""
    for uid in range(4):
        s = SessionRouterCalls(fleet, {})
        r = s.turn(conversation(uid), agent_headers(1000 + uid, version_tag=5))
        assert s.served(r) == fleet.ids[1], r.headers
        assert r.headers["x-version-tag"] == "5"


def test_a_sticky_hint_sent_per_turn_binds(fleet):
    """A sticky session's turns carry its instance (PSRL's agent loop passes it, the
    SessionRouter re-sends the recorded one): every turn is served there, though the version
    sort alone would send an unversioned turn to the newest instance."""
    s = SessionRouterCalls(fleet, {})
    messages = conversation(7)
    seen = []
    for i in range(4):
        r = s.turn(messages, agent_headers(2000, version_tag=-1, sticky=True, instance=(fleet.ids[0], 0)))
        seen.append(s.served(r))
        messages = messages + [r.json()["choices"][0]["message"], {"role": "user", "content": f"more {i}"}]
    assert seen == [fleet.ids[0]] * 4


def test_a_force_pin_once_sent_per_turn_binds_one_turn(fleet):
    """``/control/continue`` with an instance arms the SessionRouter's one-shot pin: that turn
    carries the instance and ``x-force-pin-once`` and is served there; the next turn (the hint
    re-sent without opting in) routes freely again, within the session's floor."""
    s = SessionRouterCalls(fleet, {})
    s.pin_once = (fleet.ids[1], "0")
    messages = conversation(9)
    r = s.turn(messages, agent_headers(3000))
    assert s.served(r) == fleet.ids[1]
    messages = messages + [r.json()["choices"][0]["message"], {"role": "user", "content": "next"}]
    r2 = s.turn(messages, agent_headers(3000))
    assert s.served(r2) == fleet.ids[0]


def test_the_session_openai_surface_behind_the_session_url(fleet):
    """PSRL 19c0474 psrl/workers/gen/session_router.py:122-125,269-283 passes any other
    ``/sessions/{sid}/{path}`` on, so an agent pointed at ``<router>/sessions/{sid}/v1`` (the
    base URL of psrl/workers/agent_loop/loops/session_agent_loop.py:95) lists models and runs
    completions there."""
    sid = fleet.client.post("/sessions", headers=agent_headers(4000)).json()["session_id"]
    models = fleet.client.get(f"/sessions/{sid}/v1/models")
    assert models.status_code == 200, models.text
    assert MODEL in [m["id"] for m in models.json()["data"]]
    done = fleet.client.post(
        f"/sessions/{sid}/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4}
    )
    assert done.status_code == 200, done.text
    assert done.json()["object"] == "text_completion" and done.json()["choices"][0]["text"]


def test_tito_chat_answers_carry_logprobs(fleet):
    """PSRL 19c0474 tests/e2e/tito/verify_tito_training_data.py:172-190 fails a turn whose
    ``choices[0].logprobs`` is null; it sends no ``logprobs`` field (:55)."""
    sid = fleet.client.post("/sessions").json()["session_id"]
    body = {"model": MODEL, "messages": conversation(11), "temperature": 0.7, "max_tokens": 6}
    r = fleet.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == r.json()["usage"]["completion_tokens"] > 0
    assert all(isinstance(c["logprob"], float) and isinstance(c["token"], str) for c in content)
    snap = fleet.client.get(f"/sessions/{sid}").json()
    (record,) = snap["trajectories"][0]["records"]
    assert [c["logprob"] for c in content] == [lp for lp, _ in record["output_logprobs"]][: len(content)]
