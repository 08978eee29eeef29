"""The in-process test tokenizer (smgrl.tito.testkit), built once per test session."""

import pytest

from smgrl.tito.chat import ChatTokenizer
from smgrl.tito.merge import Boundary
from smgrl.tito.testkit import make_model_dir


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tito-models")
    return {name: make_model_dir(root / name, name) for name in ("chatml", "reasoning")}


@pytest.fixture(scope="session")
def chat(model_dirs):
    return ChatTokenizer.load(model_dirs["chatml"])


@pytest.fixture(scope="session")
def reasoning(model_dirs):
    return ChatTokenizer.load(model_dirs["reasoning"])


@pytest.fixture(scope="session")
def boundary(chat):
    return Boundary.derive(chat)
