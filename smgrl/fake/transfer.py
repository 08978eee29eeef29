"""Bookkeeping of distributed weight transfers (process groups, update rounds).

By default nothing is received: a fake records the metadata of each update
(names/dtypes/shapes) and derives its new weights digest from it. With ``real=True`` and torch
importable, :mod:`smgrl.fake.distributed` joins the trainer's gloo group and receives the
broadcast tensors; their checksums are kept per name. torch is imported only then.

Without real transfers the fake holds no tensor: the checksum it keeps per name is that of the
declared metadata (``declared_checksum``), so a test without torch can pass the checksums the
engine will report to a refit (``source.distributed.checksums``). ``corrupt`` (the
``corrupt_transfers`` knob) keeps a wrong checksum instead, as a tensor damaged in transit would.
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs


@attrs.define(eq=False)
class WeightTransfers:
    real: bool = False
    groups: dict[str, dict[str, Any]] = attrs.Factory(dict)
    updates: list[dict[str, Any]] = attrs.Factory(list)
    checksums: dict[str, str] = attrs.Factory(dict)
    _receivers: dict[str, Any] = attrs.Factory(dict)

    @property
    def receiving(self) -> bool:
        if not self.real:
            return False
        from smgrl.fake import distributed

        return distributed.available()

    async def init_group(self, name: str, info: dict[str, Any]) -> None:
        """Join (or, without real transfers, just remember) a weight-update group.

        Real mode blocks until the trainer's rank 0 and every other rank joined: that is the
        rendezvous a real engine performs, and why this call is not idempotent.
        """
        if self.receiving:
            from smgrl.fake import distributed

            old = self._receivers.pop(name, None)
            if old is not None:
                await old.close()
            self._receivers[name] = await distributed.GlooReceiver.join(name, info)
        self.groups[name] = dict(info)

    async def destroy_group(self, name: str) -> bool:
        receiver = self._receivers.pop(name, None)
        if receiver is not None:
            await receiver.close()
        return self.groups.pop(name, None) is not None

    async def receive(
        self,
        group: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        corrupt: bool = False,
        **meta: Any,
    ) -> dict[str, str]:
        """Take one update round; returns {name: checksum} (of the metadata without real
        transfers)."""
        receiver = self._receivers.get(group)
        if receiver is not None:
            sums = await receiver.receive(names, dtypes, shapes)
        else:
            sums = {n: declared_checksum(n, d, s) for n, d, s in zip(names, dtypes, shapes, strict=True)}
        if corrupt:
            sums = {n: hashlib.sha256(f"corrupt:{v}".encode()).hexdigest() for n, v in sums.items()}
        self.checksums.update(sums)
        self.updates.append(
            {"group": group, "names": names, "dtypes": dtypes, "shapes": shapes, "checksums": sums, **meta}
        )
        return sums

    async def close(self) -> None:
        for name in list(self._receivers):
            await self.destroy_group(name)

    # A to_json of its own fields (shaped like every record's to_json; nothing to share).
    def to_json(self) -> dict[str, Any]:
        return {
            "real": self.receiving,
            "groups": self.groups,
            "updates": self.updates,
            "checksums": self.checksums,
        }


def declared_checksum(name: str, dtype: str, shape: list[int]) -> str:
    """What a fake without real transfers reports for a tensor it was told about."""
    return hashlib.sha256(f"{name}|{dtype}|{list(shape)}".encode()).hexdigest()
