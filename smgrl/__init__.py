"""smgrl: an RL control plane for fleets of LLM inference engines.

Wire-compatible with SMG 1.13.0's ``/v1/rl`` control plane; every registration, control call
and outcome is an event in the journal (the ``journal`` package: a SQLite file, PostgreSQL for
gateways on several hosts, or memory for tests), and everything the gateway knows is a projection
of that journal.
"""

__version__ = "0.1.0"
