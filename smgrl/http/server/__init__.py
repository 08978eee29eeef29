"""smgrl's HTTP/1.1 server (the gateway's listener): ``serve`` an ASGI app on bound sockets.

Requests are parsed by httptools (llhttp, in C); answers are the bytes the patched hypercorn
wrote before (tests/cli/test_hypercorn_wire.py holds the two to it). The scope extensions
``DISCONNECT_EXTENSION`` and ``RECEIVE_NOWAIT`` are what smgrl's raw fronts use."""

from smgrl.http.server.appqueue import DISCONNECT_EXTENSION, RECEIVE_NOWAIT
from smgrl.http.server.serve import serve

__all__ = ["DISCONNECT_EXTENSION", "RECEIVE_NOWAIT", "serve"]
