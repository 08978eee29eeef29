"""Control URL resolution (docs/tokenspeed.md; SMG's control.rs, gateway rl_adapter.rs)."""

import pytest

from smgrl.core.control_url import control_url_for, host_of, resolve_control_url, split_host_port


# -- crate: concrete_hosts_pass_through ------------------------------------------------------------
@pytest.mark.parametrize(
    ("advertised", "worker", "want"),
    [
        ("http://10.0.0.5:40100", "grpc://10.0.0.5:30000", "http://10.0.0.5:40100"),
        ("http://ctl.internal:8001/", "grpc://a:1", "http://ctl.internal:8001"),
        ("  http://ctl.internal:8001///  ", "grpc://a:1", "http://ctl.internal:8001"),
        ("https://ctl:1/base/", "grpc://a:1", "https://ctl:1/base"),
        ("http://[fd00::5]:1", "grpc://a:1", "http://[fd00::5]:1"),
        ("http://127.0.0.1:1", "grpc://a:1", "http://127.0.0.1:1"),
    ],
)
def test_concrete_hosts_pass_through(advertised, worker, want):
    assert resolve_control_url(advertised, worker) == want


# -- crate: wildcard_hosts_take_the_worker_host ----------------------------------------------------
@pytest.mark.parametrize(
    ("advertised", "worker", "want"),
    [
        ("http://0.0.0.0:40100", "grpc://10.0.0.5:30000", "http://10.0.0.5:40100"),
        ("http://[::]:40100", "grpc://[fd00::5]:30000", "http://[fd00::5]:40100"),
        # A DP-rank suffix on the worker URL is not part of the host.
        ("http://:40100", "grpc://10.0.0.5:30000@2", "http://10.0.0.5:40100"),
        # Port and path are kept; trailing slashes stripped first.
        ("http://0.0.0.0:40100/rl/", "grpc://h:1", "http://h:40100/rl"),
        ("http://0.0.0.0", "grpc://h:1", "http://h"),  # no port advertised, none added
        ("http://::", "grpc://h:1", "http://h"),  # bare `::` has no port
        ("http://0.0.0.0:40100", "grpc://h", "http://h:40100"),
        ("http://0.0.0.0:40100", "h:30000", "http://h:40100"),  # schemeless worker URL
        ("http://0.0.0.0:40100", "grpc://h@3", "http://h:40100"),
        ("http://0.0.0.0:", "grpc://h:1", "http://h:"),  # an empty port stays as given
    ],
)
def test_wildcard_hosts_take_the_worker_host(advertised, worker, want):
    assert resolve_control_url(advertised, worker) == want


# -- crate: schemeless_or_odd_input_is_returned_unchanged -----------------------------------------
@pytest.mark.parametrize(
    ("advertised", "want"),
    [
        ("10.0.0.5:40100", "10.0.0.5:40100"),
        ("0.0.0.0:40100", "0.0.0.0:40100"),  # no scheme: not resolved even if wildcard
        (" ctl:1/ ", "ctl:1"),
        ("", ""),
        ("http://", "http:"),  # trailing slashes go first; then there is no `://`
        ("http://a:b:c", "http://a:b:c"),
    ],
)
def test_schemeless_or_odd_input_is_returned_unchanged(advertised, want):
    assert resolve_control_url(advertised, "grpc://w:1") == want


@pytest.mark.parametrize(
    ("authority", "want"),
    [
        ("h:1", ("h", "1")),
        ("h", ("h", None)),
        ("[fd00::5]:30000", ("[fd00::5]", "30000")),
        ("[fd00::5]", ("[fd00::5]", None)),
        ("[::]x", ("[::]", None)),
        ("::", ("::", None)),
        ("a:b:c", ("a:b:c", None)),
        (":1", ("", "1")),
        ("", ("", None)),
        ("[oops:1", ("[oops", "1")),  # no `]`: split on the last `:` like any other host
    ],
)
def test_split_host_port(authority, want):
    assert split_host_port(authority) == want


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("grpc://10.0.0.5:30000@2", "10.0.0.5"),
        ("http://[fd00::5]:30000/x", "[fd00::5]"),
        ("http://h", "h"),
        ("h:1", "h"),
    ],
)
def test_host_of(url, host):
    assert host_of(url) == host


# -- gateway rl_adapter.rs: which workers get a control endpoint ---------------------------------


def test_http_worker_controls_itself():
    labels = {"rl.control_url": "http://elsewhere:1"}  # ignored on HTTP workers
    assert control_url_for("http", "http://w:1", "http://w:1@0", labels) == "http://w:1"


def test_grpc_worker_with_a_label_gets_a_control_endpoint():
    labels = {"rl.control_url": "http://0.0.0.0:30400"}
    assert control_url_for("grpc", "grpc://10.0.0.5:30000", "grpc://10.0.0.5:30000", labels) == (
        "http://10.0.0.5:30400"
    )


@pytest.mark.parametrize("labels", [{}, {"rl.control_url": ""}, {"rl.control_url": " \t"}])
@pytest.mark.parametrize("mode", ["grpc", "zmq"])
def test_grpc_or_zmq_worker_without_a_usable_label_has_no_control_endpoint(mode, labels):
    assert control_url_for(mode, "grpc://w:1", "grpc://w:1", labels) is None
