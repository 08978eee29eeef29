"""The tokenizer a gRPC engine served, per engine origin, for the exchanges of this process.

Discovery fetches each model's ``GetTokenizer`` bundle and builds its tokenizer
(``smgrl.registry``): ``lookup`` reads that. A process that did not run the engine's discovery
(with ``--workers N`` only the discovery lease holder does) fetches the bundle itself, once per
engine, on the first exchange with it: concurrent first requests wait for that one fetch. A
bundle that makes no tokenizer, or an engine without ``GetTokenizer``, is remembered as none; a
failed fetch (the engine unreachable, a timeout) is tried again by a later request.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from smgrl.tito import ChatTokenizer, TitoError
from smgrl.upstream import EngineClient, GrpcError, StatusCode, TokenizerMismatch

FETCH_TIMEOUT_SECS = 30.0
_NO_TOKENIZER = (StatusCode.UNIMPLEMENTED, StatusCode.FAILED_PRECONDITION)


def _none(base_url: str):
    return None


class EngineTokenizers:
    def __init__(self) -> None:
        self.lookup: Callable[[str], ChatTokenizer | None] = _none  # discovery's, when it ran here
        self._known: dict[str, ChatTokenizer | None] = {}  # origin -> fetched here (None: it has none)
        self._fetching: dict[str, trio.Event] = {}

    async def get(self, client: EngineClient, base_url: str) -> ChatTokenizer | None:
        found = self.lookup(base_url)
        if found is not None:
            return found
        if base_url in self._known:
            return self._known[base_url]
        pending = self._fetching.get(base_url)
        if pending is not None:
            await pending.wait()
            return self._known.get(base_url)
        done = self._fetching[base_url] = trio.Event()
        try:
            self._known[base_url] = await _fetch(client)
        except (GrpcError, TokenizerMismatch, trio.TooSlowError, OSError):
            pass  # not remembered: a later request asks again
        finally:
            del self._fetching[base_url]
            done.set()
        return self._known.get(base_url)


async def _fetch(client: EngineClient) -> ChatTokenizer | None:
    try:
        data, _sha = await client.tokenizer(timeout=FETCH_TIMEOUT_SECS)
    except GrpcError as exc:
        if exc.code in _NO_TOKENIZER:
            return None
        raise
    try:
        # A worker thread: parsing a real model's tokenizer.json takes longer than a loop turn may.
        return await trio.to_thread.run_sync(ChatTokenizer.from_bundle, data)
    except TitoError:
        return None
