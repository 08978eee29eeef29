"""One HTTP call driven as a raw ASGI call on the app, for what httpx's ASGI transport cannot do:
streams that never end (it waits for the end of a body) and a client that leaves mid-request."""

from __future__ import annotations

import trio


class AsgiCall:
    """``method path`` with ``body``: its status, the body so far, and ``gone`` (set it and the
    client disconnects: ``receive`` answers ``http.disconnect``)."""

    def __init__(self, app, path: str, *, method: str = "GET", body: bytes = b"", headers=()) -> None:
        self.app = app
        path, _, query = path.partition("?")
        head = [(b"host", b"smgrl.test"), *headers]
        if body:
            head += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": head,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "extensions": {},
        }
        self.request_body = body
        self.status: int | None = None
        self.body = b""
        self.changed = trio.Event()
        self.gone = trio.Event()
        self.done = trio.Event()
        self._asked = False

    async def receive(self):
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": self.request_body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
        self.changed.set()
        self.changed = trio.Event()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await self.app(self.scope, self.receive, self.send)
        finally:
            self.done.set()

    async def wait_for(self, predicate, timeout: float = 20) -> None:
        with trio.fail_after(timeout):
            while not predicate(self):
                await self.changed.wait()
