"""smgrl/core/origin.py: the one origin parser (pool keys, control calls, the registry)."""

from __future__ import annotations

import pytest

from smgrl.core.origin import hostport, origin_key, origin_of

CASES = [
    ("http://h:1", "http://h:1"),
    ("http://h:1/", "http://h:1"),
    ("http://ctl:8001/engine/x", "http://ctl:8001"),
    ("http://h:1?q=1", "http://h:1"),
    ("http://h:1#f", "http://h:1"),
    ("HTTPS://Engine-A:443/x", "HTTPS://Engine-A:443"),
    ("http://[::1]:30000/generate", "http://[::1]:30000"),
    ("grpc://w:5000", "grpc://w:5000"),
]


@pytest.mark.parametrize(("url", "origin"), CASES)
def test_origin_is_scheme_and_authority_as_written(url, origin):
    assert origin_of(url) == origin
    assert origin_key(url) == origin.lower()


def test_same_engine_whatever_the_case_and_path():
    assert origin_key("HTTP://Host:1/a") == origin_key("http://host:1?b") == origin_key("http://HOST:1")
    assert origin_key("http://h:1") != origin_key("http://h:2") != origin_key("https://h:2")


@pytest.mark.parametrize("url", ["", "h:1", "h:1/x", "//h:1"])
def test_a_url_without_a_scheme_has_no_origin(url):
    with pytest.raises(ValueError, match="has no scheme"):
        origin_of(url)


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [("127.0.0.1", 8080, "127.0.0.1:8080"), ("::1", 30000, "[::1]:30000"), ("localhost", 0, "localhost:0")],
)
def test_hostport_brackets_an_ipv6_address(host, port, expected):
    assert hostport(host, port) == expected
