import json
import pathlib
import urllib.error
import urllib.request

import pytest

from smgrl.demo.procs import launch_gateway, start_fake_engines

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
    def start(*args, journal=None, port=None, env=None):
        journal = journal or str(tmp_path / "journal.db")
        child, chosen = launch_gateway(["--journal", journal, *args], log_dir=tmp_path, env=env, port=port)
        children.append(child)
        return child, Http(f"http://127.0.0.1:{chosen}"), chosen

    return start


class Engines:
    """Fake engines on one transport: the URLs to register, their HTTP control URLs, and how
    a gateway gets them (``--worker-urls`` over HTTP; over gRPC a registration naming each
    engine's control URL, then a wait until discovery chose its wire)."""

    def __init__(self, transport: str, urls: list[str], control_urls: list[str], runtime: str):
        self.transport = transport
        self.urls = urls
        self.control_urls = control_urls
        self.runtime = runtime

    def gateway_args(self) -> list[str]:
        return ["--worker-urls", *self.urls] if self.transport == "http" else []

    def register(self, http: Http, labels: dict | None = None, timeout: float = 30.0) -> None:
        import time

        if self.transport == "http":
            return
        for url, control in zip(self.urls, self.control_urls, strict=True):
            body = {"url": url, "connection_mode": "grpc", "runtime": self.runtime,
                    "labels": {"rl.control_url": control, **(labels or {})}}  # fmt: skip
            status, _, payload = http.request("POST", "/workers", body)
            assert status == 202, payload
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # bounded: discovery is asynchronous
            status, _, payload = http.request("GET", "/v1/rl/workers")
            rows = payload.get("workers", []) if status == 200 else []
            if len(rows) >= len(self.urls) and all(r["labels"].get("grpc_wire") for r in rows):
                return
            time.sleep(0.05)
        raise AssertionError(f"gRPC workers not discovered: {payload}")


@pytest.fixture(params=["http", "grpc"])
def transport(request):
    """The scenario runs on both transports: HTTP engines, and the same fakes served over gRPC."""
    return request.param


@pytest.fixture
def engines(children, transport):
    def start(kind="sglang", count=1, *extra):
        args = [*extra, "--grpc"] if transport == "grpc" else list(extra)
        child, urls = start_fake_engines(kind, count, args)
        children.append(child)
        return Engines(transport, urls, child.control_urls or urls, kind)

    return start
