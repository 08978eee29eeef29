"""Control operations on engines: one call or a fan-out with their journal records
(``service``), the call itself (``call``, ``fanout``, ``outcome``) and the journal-only writes
(``writes``)."""

from smgrl.control.call import ControlRequest
from smgrl.control.service import CallContext, ControlService, OpResult
from smgrl.control.writes import ControlWrites

__all__ = [
    "CallContext",
    "ControlRequest",
    "ControlService",
    "ControlWrites",
    "OpResult",
]
