"""Data-plane routing as pure code: which engine instance serves a rollout request.

- ``instance``: the routable instances of the fleet, built from the registry projection.
- ``policy``: ``round_robin``, ``random``, ``power_of_two``, ``cache_aware`` (+ ``radix``, its
  approximate prefix tree), and ``x-smg-routing-key`` stickiness.
- ``eligibility``: the version- and state-aware filter over the engine projection.
- ``version_policy``: ``any | latest-only | min-version:V | max-staleness:K`` and PSRL's
  ``x-version-tag`` floor.
- ``metadata``: PSRL's routing headers (and the body fields they override), parsed.
- ``staged``: PSRL's staged selection (floor, admission refusals, instance hint, prompt-group
  pin, version sort, then the policy), one pure function.

No I/O and no clock here: randomness and time come in as arguments, so every rule is
table-tested (``tests/unit/test_routing*.py``). ``smgrl.dataplane`` is the I/O shell.
"""
