"""Token-in/token-out capture for agent sessions (TITO): the pure core.

See docs/sessions.md. Nothing here does I/O beyond loading a model directory.
"""

from smgrl.tito.chat import ChatTokenizer, TemplateError, TitoError
from smgrl.tito.training import build_training_data, training_data

__all__ = ["ChatTokenizer", "TemplateError", "TitoError", "build_training_data", "training_data"]
