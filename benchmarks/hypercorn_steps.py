#!/usr/bin/env python3
"""Task steps, spawned tasks and cyclic garbage per kept-alive request: stock hypercorn 0.18.0
vs smgrl's patches (docs/hypercorn-patches.md), on one loopback connection in one trio run.

    python benchmarks/hypercorn_steps.py stock      # hypercorn as installed
    python benchmarks/hypercorn_steps.py patched    # after smgrl.http.hypercorn_patches.apply()
"""

import collections
import gc
import os
import sys

import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.trio import serve

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if sys.argv[1:] == ["patched"]:
    from smgrl.http import hypercorn_patches

    assert hypercorn_patches.apply()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Steps(trio.abc.Instrument):
    def __init__(self, skip):
        self.skip = skip
        self.n = collections.Counter()
        self.spawned = 0

    def before_task_step(self, task):
        if task is not self.skip:
            self.n[task.coro.cr_code.co_name] += 1

    def task_spawned(self, task):
        self.spawned += 1


async def main():
    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.errorlog = None
    shutdown = trio.Event()
    async with trio.open_nursery() as n:
        urls = await n.start(
            lambda task_status: serve(app, cfg, shutdown_trigger=shutdown.wait, task_status=task_status)
        )
        s = await trio.open_tcp_stream("127.0.0.1", int(urls[0].rsplit(":", 1)[1]))
        req = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello"

        async def one():
            await s.send_all(req)
            buf = b""
            while not buf.endswith(b"ok"):
                buf += await s.receive_some(1000)
            await trio.testing.wait_all_tasks_blocked()

        await one()
        st = Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(st)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        N = 100
        for _ in range(N):
            await one()
        gc.collect()
        garbage = len(gc.garbage)
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        trio.lowlevel.remove_instrument(st)
        print(
            sys.argv[1],
            "server task steps/request",
            {k: v / N for k, v in st.n.items()},
            "tasks spawned/request",
            st.spawned / N,
            "cyclic garbage objects/request",
            garbage / N,
        )
        shutdown.set()


trio.run(main)
