"""The forwarding rules (smgrl/cluster/forwarding.py): where a request for another process goes, how many
hops it may take, and the ``x-smgrl-forwarded`` count parsed from the headers."""

from __future__ import annotations

import pytest

from smgrl.cluster.forwarding import MAX_HOPS, Forwarder, Peer, PeerGone, hops, owner_key
from smgrl.core.config import ConfigError, advertise_url_problem
from smgrl.sessions.state import owner_of

ME = Peer("host-a:1:aaaa", owner_key("host-a:1:aaaa"), "host-a", "http://127.0.0.1:1001")
LOCAL = Peer("host-a:2:bbbb", owner_key("host-a:2:bbbb"), "host-a", "http://127.0.0.1:1002", "http://a:30000")
REMOTE = Peer(
    "host-b:3:cccc", owner_key("host-b:3:cccc"), "host-b", "http://127.0.0.1:1003", "http://b:30000"
)
REMOTE_BARE = Peer("host-c:4:dddd", owner_key("host-c:4:dddd"), "host-c", "http://127.0.0.1:1004")

ROUTES = [
    # (peer, hops so far, the URL, or None: PeerGone)
    (LOCAL, 0, "http://127.0.0.1:1002"),  # same host: its loopback listener
    (LOCAL, 1, "http://127.0.0.1:1002"),  # second hop, on the owner's host: still loopback
    (LOCAL, MAX_HOPS, None),  # never a third hop
    (REMOTE, 0, "http://b:30000"),  # another host: its advertised URL
    (REMOTE, 1, None),  # a forwarded request is never sent to a third host
    (REMOTE_BARE, 0, None),  # another host without --advertise-url: unreachable from here
]


@pytest.mark.parametrize(("peer", "n", "url"), ROUTES)
def test_where_a_forwarded_request_goes(peer, n, url):
    fwd = Forwarder(store=None, me=ME)
    if url is None:
        with pytest.raises(PeerGone):
            fwd.target(peer, n)
    else:
        assert fwd.target(peer, n) == url


@pytest.mark.parametrize(
    ("headers", "n"),
    [
        ([], 0),
        ([(b"x-smgrl-forwarded", b"1")], 1),
        ([(b"x-smgrl-forwarded", b"2")], 2),
        ([(b"x-smgrl-forwarded", b"x")], MAX_HOPS),  # not a count: never forwarded again
        ([(b"x-smgrl-forwarded", b"99999")], MAX_HOPS),
        ([(b"x-smgrl-forwarded", b"-1")], MAX_HOPS),
    ],
)
def test_hops_so_far(headers, n):
    assert hops(headers) == n


def test_a_session_id_of_a_process_names_its_owner():
    owner = owner_key("host-a:1:aaaa")
    assert owner_of(f"{owner}-{'0' * 32}") == owner
    assert owner_key("host-a:1:aaab") != owner


def test_the_forwarded_headers_drop_the_hop_by_hop_ones_and_keep_the_callers_key():
    fwd = Forwarder(store=None, me=ME)
    headers = [
        (b"authorization", b"Bearer k"),
        (b"connection", b"keep-alive"),
        (b"content-length", b"3"),
        (b"host", b"x"),
        (b"x-smgrl-forwarded", b"1"),
        (b"x-request-id", b"r1"),
    ]
    out = fwd._headers(headers, REMOTE, 0)
    assert out == [
        (b"authorization", b"Bearer k"),
        (b"x-request-id", b"r1"),
        (b"x-smgrl-forwarded", b"1"),
        (b"x-smgrl-forwarded-to", REMOTE.owner.encode()),
    ]


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://10.0.0.1:30000", True),
        ("https://gw-1.example:443/", True),
        ("http://user:pw@10.0.0.1:30000", False),
        ("http://10.0.0.1", False),
        ("http://10.0.0.1:30000/path", False),
        ("ftp://10.0.0.1:21", False),
        ("http://10.0.0.1:99999", False),
    ],
)
def test_advertise_url_values(url, ok):
    assert (advertise_url_problem(url) is None) == ok


def test_a_bad_advertise_url_is_a_config_error():
    from smgrl.core.config import Config
    from smgrl.runtime.startup import validate

    with pytest.raises(ConfigError, match="--advertise-url"):
        validate(Config(advertise_url="http://u:secret@h:1"))
