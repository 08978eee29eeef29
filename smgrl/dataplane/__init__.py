"""The data plane: rollout traffic through the gateway (docs/data-plane.md).

- ``request``: what a rollout request says (model, stream, prompt prefix), pure.
- ``table``: the fleet's routable instances per model and why each is held out, pure.
- ``stamp``: the version headers and ``system_fingerprint``, pure.
- ``breaker`` (pure), ``admission``: per-engine circuit breakers, the concurrency limit.
- ``service``: ``DataPlane``, the I/O shell: pick (waiting for an eligible engine), forward
  with retries, account.
- ``metrics``: the data plane's Prometheus families.
- ``errors``: its error codes.
- ``testing``: helpers for tests (a gateway on loopback, a scripted engine).

The HTTP side is ``smgrl.api.dataplane`` (raw ASGI in front of Quart); the routing rules are
``smgrl.routing``.
"""
