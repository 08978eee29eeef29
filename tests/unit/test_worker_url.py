"""Worker URLs: the one check shared by POST/PUT /workers and `launch --worker-urls` (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.core.worker import reaches_listener, redact_url, worker_url_problem

SCHEME = "URL must start with a lowercase http://"
CREDS = "must not carry credentials"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:31002", None),
        ("http://127.0.0.1:31002@1", None),  # rank 1 of a DP engine, not userinfo
        ("https://engine.local/v1", None),
        ("grpc://10.0.0.5:50051", None),
        ("http://h/path@x", None),  # an @ in the path is not userinfo
        ("http://h/?q=a@b", None),
        ("127.0.0.1:31002", SCHEME),  # SMG refuses it too, at launch and POST
        ("localhost:31002", SCHEME),
        ("HTTP://h:1", SCHEME),
        ("http://u:PASS@127.0.0.1:31002", CREDS),
        ("http://u:PASS@127.0.0.1:31002@1", CREDS),
        ("http://token@h", CREDS),
        ("http://@h:1", CREDS),
        ("http://u:p@", CREDS),
        # An all-digit host (2130706433 is 127.0.0.1 to most resolvers) after a password passed as
        # "rank 2130706433 of http://u:PASS": accepted, echoed and journaled with the password.
        ("http://u:PASS@2130706433", CREDS),
        ("http://u:PASS@2130706433/", CREDS),
        ("http://u:PASS@5/v1", CREDS),
        ("grpc://u:PASS@5", CREDS),
        ("http://u:PASS@h:1@2130706433", CREDS),
        ("http://127.0.0.1:1@²", CREDS),  # "²" is no rank (Rust's usize parse): userinfo then
        ("http://127.0.0.1:1@" + "9" * 30, CREDS),  # past usize: no rank either
        ("http://", "empty host"),
        ("http://:80", "empty host"),
        ("http://a b:1", "invalid international domain name"),
    ],
)
def test_worker_url_problem(url, expected):
    problem = worker_url_problem(url)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem
        assert problem.startswith("Invalid value for field 'worker_url': ")


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://u:PASS@h:1", "http://***@h:1"),
        ("http://u:PASS@h:1@2", "http://***@h:1@2"),
        ("https://a@b@h/x@y", "https://***@h/x@y"),
        ("http://h:1@2", "http://h:1@2"),
        ("http://u:PASS@2130706433", "http://***@2130706433"),
        ("http://u:PASS@7/x", "http://***@7/x"),
        ("h:1", "h:1"),
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


@given(
    st.sampled_from(["http", "https", "grpc", "ftp", "HTTP"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:%", min_size=1, max_size=20),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=%", max_size=20),
    st.sampled_from(["127.0.0.1:1", "h", "[::1]:8000", "h:1@3", "2130706433", "5/v1", "7@8"]),
)
def test_a_password_is_never_echoed(scheme, user, password, host):
    url = f"{scheme}://{user}:PW{password}@{host}"  # "PW" appears nowhere else in the text
    problem = worker_url_problem(url)
    assert problem is not None and "PW" not in problem


@pytest.mark.parametrize(
    "url, host, port, reaches",
    [
        ("http://127.0.0.1:30000", "127.0.0.1", 30000, True),
        ("http://localhost:30000/", "127.0.0.1", 30000, True),
        ("http://LOCALHOST.:30000", "127.0.0.1", 30000, True),
        ("http://127.0.0.1:30000@1", "127.0.0.1", 30000, True),  # a DP rank of it
        ("http://[::1]:30000", "::1", 30000, True),
        ("http://127.0.0.1:30000", "0.0.0.0", 30000, True),  # wildcard listener
        ("http://10.0.0.5:30000", "10.0.0.5", 30000, True),
        ("http://127.0.0.1", "127.0.0.1", 80, True),  # default port
        ("https://127.0.0.1", "127.0.0.1", 443, True),
        ("http://127.0.0.1:30001", "127.0.0.1", 30000, False),
        ("http://10.0.0.6:30000", "10.0.0.5", 30000, False),
        ("http://127.0.0.1:30000", "10.0.0.5", 30000, False),  # listener not on loopback
        ("http://10.0.0.5:30000", "0.0.0.0", 30000, False),  # unknowable without I/O: discovery's job
        ("grpc://127.0.0.1:30000", "127.0.0.1", 30000, False),
        ("http://127.0.0.1:30000", None, None, False),
        ("http://127.0.0.1:x", "127.0.0.1", 30000, False),
    ],
)
def test_reaches_listener(url, host, port, reaches):
    assert reaches_listener(url, host, port) is reaches


def test_every_gateway_on_one_journal_has_the_journal_id(tmp_path):
    from journal import JournalWriter, MemoryStore, SqliteStore
    from smgrl.core.config import Config
    from smgrl.registry.keys import KeyRing
    from smgrl.runtime.gateway import Gateway
    from smgrl.state.fleet import FleetState

    def build(store) -> Gateway:
        return Gateway.build(
            Config(), fleet=FleetState(), journal=JournalWriter(store), store=store, keys=KeyRing({})
        )

    store = SqliteStore.open(str(tmp_path / "j.db"))
    try:
        assert {build(store).instance_id for _ in range(2)} == {store.meta()["journal_id"]}
    finally:
        store.close()
    memory = [build(MemoryStore()) for _ in range(2)]
    assert len({g.instance_id for g in memory}) == 2 and all(len(g.instance_id) == 32 for g in memory)
