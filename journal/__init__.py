"""The smgrl event journal: an append-only SQLite event store with a hash chain."""
