"""``request_num_balance`` (PSRL's default policy): fewest requests in flight through the gateway,
then the engines' own reports, then the order given; under the staged selection it ranks every
kept candidate (the fork's policy ignores the sort groups except as a tie-break)."""

from __future__ import annotations

from smgrl.core.version import Version
from smgrl.dataplane.instance_stats import InstanceStats, InstanceStatsTable
from smgrl.dataplane.table import Entry
from smgrl.routing import POLICIES, make_policy
from smgrl.routing.instance import Instance
from smgrl.routing.staged import identity, select


def inst(name: str, rank: int = 0) -> Instance:
    return Instance(
        worker_id=f"{name}@{rank}",
        url=f"http://{name}@{rank}",
        base_url=f"http://{name}",
        group=name,
        dp_rank=rank,
        model="m",
        label_version=None,
    )


def entry(name: str, version: str | None, rank: int = 0) -> Entry:
    return Entry(instance=inst(name, rank), hold=None, version=version, control="active")


def test_listed_as_a_policy():
    assert "request_num_balance" in POLICIES


def test_fewest_in_flight_wins():
    policy = make_policy("request_num_balance")
    a, b, c = inst("a"), inst("b"), inst("c")
    loads = {a.worker_id: 5, b.worker_id: 1, c.worker_id: 3}
    assert policy.select([a, b, c], loads, None, 0.0) is b


def test_gateway_count_leads_then_the_engine_report_then_the_order():
    stats = InstanceStatsTable()

    def reported(instance):
        found = stats.get(*identity(instance))
        return 0 if found is None else found.requests

    policy = make_policy("request_num_balance", reported=reported)
    a, b, c = inst("a"), inst("b"), inst("c")
    loads = {a.worker_id: 2, b.worker_id: 2, c.worker_id: 2}
    assert policy.select([a, b, c], loads, None, 0.0) is a  # all alike: the first
    stats.put("a", 0, InstanceStats(running=4, waiting=1))
    stats.put("b", 0, InstanceStats(running=1, waiting=0))
    stats.put("c", 0, InstanceStats(running=3, waiting=0))
    assert policy.select([a, b, c], loads, None, 0.0) is b  # the engines' reports separate them
    loads[c.worker_id] = 1
    assert policy.select([a, b, c], loads, None, 0.0) is c  # the gateway's own count leads


def _staged(entries, loads, ranked, floor=None):
    policy = make_policy("request_num_balance")
    return select(
        entries,
        floor=Version.parse(floor) if floor is not None else None,
        hint=None,
        group_pin=None,
        refused=set(),
        choose=lambda group: next(
            e for e in entries if e.instance is policy.select([g.instance for g in group], loads, None, 0.0)
        ),
        ranked=ranked,
    )


def test_ranked_staged_selection_balances_across_versions_newest_first_on_ties():
    fleet = [entry("old", "1"), entry("new", "2"), entry("new2", "2")]
    loads = {"old@0": 0, "new@0": 3, "new2@0": 3}
    # The fork: every candidate ranked by load; the idle v1 instance wins over busy v2 ones.
    assert _staged(fleet, loads, ranked=True).chosen.instance.group == "old"
    # Unranked (every other policy): only the newest version's group reaches the policy.
    assert _staged(fleet, loads, ranked=False).chosen.instance.group == "new"
    # A tie goes to the first in sort order: newest first for an unversioned request...
    loads = {"old@0": 1, "new@0": 1, "new2@0": 1}
    assert _staged(fleet, loads, ranked=True).chosen.instance.group == "new"
    # ...lowest acceptable first for a versioned one.
    assert _staged(fleet, loads, ranked=True, floor="1").chosen.instance.group == "old"
