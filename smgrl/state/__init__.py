"""Projections: pure folds from journal events to the state the gateway serves from memory."""

from smgrl.state.fleet import FleetState
from smgrl.state.operations import Operations
from smgrl.state.refits import PHASE_ORDER, Cycle, Op, OpsFold, group_cycles, iter_cycles
from smgrl.state.sagas import EngineRun, Saga
from smgrl.state.version_timeline import Change, VersionFold

__all__ = [
    "PHASE_ORDER",
    "Change",
    "Cycle",
    "EngineRun",
    "FleetState",
    "Op",
    "Operations",
    "OpsFold",
    "Saga",
    "VersionFold",
    "group_cycles",
    "iter_cycles",
]
