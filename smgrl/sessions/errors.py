"""Session errors and their stable codes (the data plane's envelope and ``x-smg-error-code``).

::

    SessionNotFound      session_not_found       404  an id this gateway process never issued
    SessionGone          session_gone            410  an id from another (earlier) gateway process
    SessionClosing       session_closing         409  DELETE is draining it: no new turns
    TooManySessions      too_many_sessions       429  --max-sessions open (retry-after)
    SessionsDisabled     sessions_disabled       503  no --tokenizer-path
    InvalidTurn          invalid_turn            400  messages missing/not a list, bad trajectory id
    TemplateRefused      chat_template_error     400  the chat template refused the conversation
    EngineRefused        engine_refused          400  the engine refused the turn as asked (it answered
                                                      400 or 422: a completion longer than its context,
                                                      say); its message is relayed, nothing captured
    EngineAnswerInvalid  engine_answer_invalid   502  the engine's token-in answer has the wrong shape,
                                                      or another non-2xx status
    TurnAborted          turn_aborted            503  retryable: the engine aborted the generation
                                                      (a weight sync); nothing was captured
    SessionJournalUnavailable journal_unavailable 503  retryable: the journal cannot record the new
                                                      session; nothing was created
    SessionBudgetExceeded session_budget_exceeded 400 the session's captured trajectories reached
                                                      its token budget; nothing was sent to an engine
"""

from __future__ import annotations

from smgrl.core.errors import DataPlaneError


# Shaped like smgrl/core/errors.py's classes (one per code); the behaviour is ApiError's.
class SessionNotFound(DataPlaneError):
    code = "session_not_found"
    status = 404


class SessionGone(DataPlaneError):
    code = "session_gone"
    status = 410


class SessionClosing(DataPlaneError):
    code = "session_closing"
    status = 409


class TooManySessions(DataPlaneError):
    code = "too_many_sessions"
    status = 429
    retryable = True


class SessionsDisabled(DataPlaneError):
    code = "sessions_disabled"
    status = 503


TOKENIZER_UNAVAILABLE = (
    "sessions take the tokenizer a gRPC engine serves (GetTokenizer), and no registered engine has "
    "served one yet; retry once an engine is registered, or start the gateway with --tokenizer-path"
)


class TokenizerUnavailable(SessionsDisabled):
    """Sessions take the tokenizer a gRPC engine serves, and no registered engine served one yet."""

    code = "tokenizer_unavailable"
    retryable = True


class InvalidTurn(DataPlaneError):
    code = "invalid_turn"
    status = 400


class TemplateRefused(DataPlaneError):
    code = "chat_template_error"
    status = 400


class EngineRefused(DataPlaneError):
    code = "engine_refused"
    status = 400


class EngineAnswerInvalid(DataPlaneError):
    code = "engine_answer_invalid"
    status = 502


class TurnAborted(DataPlaneError):
    code = "turn_aborted"
    status = 503
    retryable = True


class SessionJournalUnavailable(DataPlaneError):
    code = "journal_unavailable"
    status = 503
    retryable = True


class SessionBudgetExceeded(DataPlaneError):
    code = "session_budget_exceeded"
    status = 400


ALL = (
    SessionNotFound,
    SessionGone,
    SessionClosing,
    TooManySessions,
    SessionsDisabled,
    InvalidTurn,
    TemplateRefused,
    EngineAnswerInvalid,
    TurnAborted,
    SessionJournalUnavailable,
    SessionBudgetExceeded,
)
