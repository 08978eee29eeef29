import json
import pathlib
import urllib.error
import urllib.request

import pytest

from smgrl.demo.procs import free_port, start_fake_engines, start_gateway, wait_listening

pytestmark = pytest.mark.e2e  # (a conftest's pytestmark marks nothing: the hook below does)


def pytest_collection_modifyitems(items):
    """Mark every test under tests/e2e as `e2e`, so `-m e2e` / `-m "not e2e"` select them."""
    here = pathlib.Path(__file__).resolve().parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


class Http:
    """Tiny stdlib client for end-to-end tests (no event loop: the processes are real)."""

    def __init__(self, base: str, token: str | None = None):
        self.base = base
        self.token = token

    def request(self, method: str, path: str, body=None, headers=None):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        hdrs = {"content-type": "application/json"} if data is not None else {}
        if self.token:
            hdrs["authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, dict(r.headers), json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, dict(e.headers), json.loads(raw) if raw else None
            except ValueError:
                return e.code, dict(e.headers), raw.decode()


@pytest.fixture
def children():
    started = []
    yield started
    for child in reversed(started):
        child.stop()


@pytest.fixture
def fakes(children):
    def start(kind="sglang", count=1, *extra):
        child, urls = start_fake_engines(kind, count, extra)
        children.append(child)
        return urls

    return start


@pytest.fixture
def gateway(children, tmp_path):
    def start(*args, journal=None, port=None):
        port = port or free_port()
        journal = journal or str(tmp_path / "journal.db")
        log = open(tmp_path / f"gateway-{port}.log", "a")  # noqa: SIM115 - held by the child for its lifetime
        child = start_gateway(
            ["--journal", journal, "--prometheus-port", str(free_port()), *args], port=port, log=log
        )
        children.append(child)
        wait_listening(f"http://127.0.0.1:{port}", child=child)
        return child, Http(f"http://127.0.0.1:{port}"), port

    return start
