"""Worker API keys, held apart from everything else.

Keys live in the journal's ``secrets`` table (written in the same transaction as the event that
introduced them) and, at run time, only here. A DP group's ranks share the key of their group.
Nothing in this class can print a key: its repr shows only how many it holds.
"""

from __future__ import annotations

from collections.abc import Mapping


class KeyRing:
    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self._keys = dict(keys or {})

    def get(self, group: str) -> str | None:
        return self._keys.get(group)

    def put(self, group: str, key: str) -> None:
        self._keys[group] = key

    def drop(self, group: str) -> None:
        self._keys.pop(group, None)

    def apply(self, changes: Mapping[str, str | None]) -> None:
        """Secret writes that just committed (the journal writer's ``on_secrets``): a key, or None
        for a removed group."""
        for group, key in changes.items():
            if key is None:
                self._keys.pop(group, None)
            else:
                self._keys[group] = key

    def values(self) -> list[str]:
        return list(self._keys.values())

    def __repr__(self) -> str:
        return f"KeyRing(<{len(self._keys)} keys redacted>)"
