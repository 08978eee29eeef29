"""Projections: pure folds from journal events to the state the gateway serves from memory."""

from smgrl.state.fleet import FleetState
from smgrl.state.group_pins import TYPES, GroupPinsState, Pin
from smgrl.state.operations import Operations
from smgrl.state.refits import PHASE_ORDER, Cycle, Op, OpsFold, group_cycles, iter_cycles, phase_of
from smgrl.state.sagas import EngineRun, Saga, Sagas
from smgrl.state.version_timeline import OK, SETTLED, UNKNOWN, Change, VersionFold

__all__ = [
    "OK",
    "PHASE_ORDER",
    "SETTLED",
    "TYPES",
    "UNKNOWN",
    "Change",
    "Cycle",
    "EngineRun",
    "FleetState",
    "GroupPinsState",
    "Op",
    "Operations",
    "OpsFold",
    "Pin",
    "Saga",
    "Sagas",
    "VersionFold",
    "group_cycles",
    "iter_cycles",
    "phase_of",
]
