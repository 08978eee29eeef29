"""Agent sessions with token-exact capture (docs/sessions.md): the I/O shell around smgrl.tito."""

from __future__ import annotations

# The face: its users' import lists name the same things (`duplicates` pairs them), nothing to share.
from smgrl.core.errors import ConfigError
from smgrl.sessions.errors import (
    EngineAnswerInvalid,
    EngineRefused,
    InvalidTurn,
    SessionBudgetExceeded,
    SessionClosing,
    SessionGone,
    SessionJournalUnavailable,
    SessionNotFound,
    SessionsDisabled,
    TemplateRefused,
    TokenizerUnavailable,
    TooManySessions,
    TurnAborted,
)
from smgrl.sessions.slices import encode_json
from smgrl.sessions.state import owner_of

__all__ = [
    "EngineAnswerInvalid",
    "EngineRefused",
    "InvalidTurn",
    "SessionBudgetExceeded",
    "SessionClosing",
    "SessionGone",
    "SessionJournalUnavailable",
    "SessionNotFound",
    "SessionsDisabled",
    "TemplateRefused",
    "TokenizerUnavailable",
    "TooManySessions",
    "TurnAborted",
    "build",
    "encode_json",
    "load_tokenizer",
    "owner_of",
]


def load_tokenizer(path: str):
    """The model's tokenizer and chat template; a bad directory is one ConfigError line."""
    from smgrl.tito import ChatTokenizer, TitoError

    try:
        return ChatTokenizer.load(path)
    except TitoError as e:
        raise ConfigError(f"--tokenizer-path: {e.message}") from None


def build(gateway, dataplane):
    """The session service of a gateway, or None when no tokenizer is configured. (The service
    module is imported here, not by this face: only a gateway with --tokenizer-path loads it.)"""
    cfg = gateway.cfg.sessions
    if not cfg.tokenizer_path and not cfg.from_engines:
        return None
    from smgrl.sessions.service import SessionService

    # Keyword arguments, shaped like other services' construction: configuration, not logic.
    return SessionService(
        chat=load_tokenizer(cfg.tokenizer_path) if cfg.tokenizer_path else None,
        tokenizer_source=dataplane.engine_tokenizer,
        dataplane=dataplane,
        fleet=gateway.fleet,
        journal=gateway.journal,
        max_sessions=cfg.max_sessions,
        gc_threshold=cfg.gc_threshold,
        strategy=cfg.trajectory_strategy,
        debug=cfg.debug,
        tool_parser=cfg.tool_parser,
        idle_timeout=cfg.idle_timeout_secs,
        max_stored_tokens=cfg.max_stored_tokens,
    )
