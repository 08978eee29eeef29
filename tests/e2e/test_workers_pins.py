"""``smgrl launch --workers 2``: a prompt group's requests, sent over several connections that
the two processes share between them, all go to one engine instance (docs/scale-out.md,
"Prompt-group pins"). The engines hang every generation, so each group's requests are running
together and the check reads where they arrived (the fakes' call logs: the body's
``prompt_id``), whatever the timing. ``--policy random`` over 4 engines: two processes pinning
on their own would split a group 3 times in 4.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections import defaultdict

import pytest
from test_workers import journal_events, metrics, request, start_supervisor, wait_until
from test_workers_pg import journal_types, pg_url, start  # noqa: F401 - pg_url is a fixture

pytestmark = pytest.mark.e2e

GROUPS, PER_GROUP = 8, 4


def calls(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/_fake/calls?path=/generate", timeout=10) as r:
        return json.loads(r.read())["calls"]


def inflight_per_process(text: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("smgrl_dataplane_inflight_requests{"):
            labels, value = line.rsplit(" ", 1)
            process = labels.split('gateway_worker="', 1)[1].split('"', 1)[0]
            out[process] += float(value)
    return dict(out)


def send_groups(bases: list[str], groups: int, per_group: int) -> None:
    """Each group's requests spread over ``bases``, one connection each, all at once."""

    def send(base: str, group: str) -> None:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, "prompt_id": group}
        try:
            request(base, "POST", "/generate", body, timeout=120)  # one connection per request
        except OSError:
            pass  # the engines never answer; the processes are stopped at the end

    for i in range(per_group):
        for g in range(groups):
            threading.Thread(target=send, args=(bases[i % len(bases)], f"group-{g}"), daemon=True).start()


def where_groups_went(urls: list[str], total: int) -> dict[str, set[str]]:
    """group -> the engines its requests reached, once ``total`` requests arrived."""
    arrived = wait_until(
        "every request at an engine",
        lambda: (
            (got := {url: calls(url) for url in urls}) and sum(len(c) for c in got.values()) == total and got
        ),
    )
    where: dict[str, set[str]] = defaultdict(set)
    for url, got in arrived.items():
        for call in got:
            where[json.loads(call["body"])["prompt_id"]].add(url)
    return where


def test_a_prompt_group_over_several_connections_lands_on_one_instance(fakes, children, tmp_path):
    urls = fakes("sglang", 4)
    journal = str(tmp_path / "j.db")
    _, base, murl, _, _ = start_supervisor(
        children, tmp_path, journal, "--enable-rl", "--policy", "random", "--psrl-group-sticky"
    )
    for url in urls:
        st, _, body = request(base, "POST", "/workers", {"url": url})
        assert st == 202, body
    wait_until(
        "both processes to see 4 ready engines",
        lambda: (
            'smgrl_workers{gateway_worker="0",health="ready"} 4.0' in (text := metrics(murl))
            and 'smgrl_workers{gateway_worker="1",health="ready"} 4.0' in text
        ),
    )
    for url in urls:
        st, _, _ = request(url, "POST", "/_fake/knobs", {"hang": True})
        assert st == 200

    send_groups([base], GROUPS, PER_GROUP)
    where = where_groups_went(urls, GROUPS * PER_GROUP)
    assert len(where) == GROUPS
    split = {group: sorted(engines) for group, engines in where.items() if len(engines) > 1}
    assert not split, split
    # Both processes routed some of them (else this proves nothing about two processes).
    per_process = inflight_per_process(metrics(murl))
    assert per_process.get("0", 0) > 0 and per_process.get("1", 0) > 0, per_process
    # One pin per group in the journal, decided once.
    pinned = [r.event.prompt_id for r in journal_events(journal) if r.event.TYPE == "dataplane.group_pinned"]
    assert sorted(pinned) == sorted(where)


def test_a_prompt_group_sent_to_two_hosts_on_postgres_lands_on_one_instance(
    fakes,
    children,
    tmp_path,
    pg_url,  # noqa: F811 - the fixture imported above
):
    """Two gateways as if on two hosts (separate ports) on one PostgreSQL journal; each group's
    requests alternate between them, all at once."""
    urls = fakes("sglang", 4)
    _, base_a = start(children, tmp_path, pg_url, "--enable-rl", "--policy", "random", "--psrl-group-sticky")
    _, base_b = start(children, tmp_path, pg_url, "--enable-rl", "--policy", "random", "--psrl-group-sticky")
    for url in urls:
        st, _, body = request(base_a, "POST", "/workers", {"url": url})
        assert st == 202, body
    for base in (base_a, base_b):
        wait_until(
            "both hosts to see 4 ready engines",
            lambda base=base: len(request(base, "GET", "/v1/rl/workers")[2]["workers"]) == 4,
        )
    for url in urls:
        st, _, _ = request(url, "POST", "/_fake/knobs", {"hang": True})
        assert st == 200
    send_groups([base_a, base_b], GROUPS, PER_GROUP)
    where = where_groups_went(urls, GROUPS * PER_GROUP)
    split = {group: sorted(engines) for group, engines in where.items() if len(engines) > 1}
    assert not split, split
    pinned = [e.prompt_id for e in journal_types(pg_url) if e.TYPE == "dataplane.group_pinned"]
    assert sorted(pinned) == sorted(where)
