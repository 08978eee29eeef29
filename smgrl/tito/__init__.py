"""Token-in/token-out capture for agent sessions (TITO): the pure core.

See docs/sessions.md. Nothing here does I/O beyond loading a model directory.
"""

from smgrl.tito.capture import assistant_message, captured, close_turn, validate
from smgrl.tito.chat import ChatTokenizer, TemplateError, TitoError
from smgrl.tito.ids import PACK_AT, is_packed
from smgrl.tito.merge import (
    Boundary,
    Rendered,
    TurnPlan,
    appended_segments,
    choose_prefix,
    hit_plan,
    miss_plan,
    prepare_turn,
    render_turn,
)
from smgrl.tito.store import CaptureTree, PrefixMismatch
from smgrl.tito.toolcalls import parser_for
from smgrl.tito.training import build_training_data, training_data

__all__ = [
    "PACK_AT",
    "Boundary",
    "CaptureTree",
    "ChatTokenizer",
    "PrefixMismatch",
    "Rendered",
    "TemplateError",
    "TitoError",
    "TurnPlan",
    "appended_segments",
    "assistant_message",
    "build_training_data",
    "captured",
    "choose_prefix",
    "close_turn",
    "hit_plan",
    "is_packed",
    "miss_plan",
    "parser_for",
    "prepare_turn",
    "render_turn",
    "training_data",
    "validate",
]
