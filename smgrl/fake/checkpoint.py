"""Fake checkpoints: a directory whose file contents ARE the weights.

A fake engine hashes the checkpoint directory it loads; the text it generates is a
deterministic function of that digest and the prompt. So writing a new checkpoint and
refitting an engine from it visibly changes what the engine says, and two engines loaded from
the same directory say the same thing.

``make_checkpoint(path, name)`` writes ``weights.json`` ({"name", "seed", ...}); any other
files in the directory count too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import attrs

DEFAULT_MODEL_NAME = "fake/Qwen3-0.6B"
WEIGHTS_FILE = "weights.json"
# Bounds so that pointing a fake at a real (huge) checkpoint stays cheap: the digest covers the
# first MiB of each of the first thousand files, plus every file's size.
_MAX_FILES = 1000
_MAX_BYTES_PER_FILE = 1 << 20


class CheckpointNotFound(FileNotFoundError):
    """The path is not a readable checkpoint directory."""


@attrs.frozen
class Checkpoint:
    path: str
    digest: str  # hex; what the fake model generates from
    name: str
    architectures: tuple[str, ...] = ("Qwen3ForCausalLM",)
    model_type: str = "qwen3"
    max_model_len: int = 40960


def make_checkpoint(path: str | os.PathLike[str], name: str, seed: int = 0, **extra: Any) -> Path:
    """Create (or overwrite) a fake checkpoint directory and return its path.

    ``extra`` keys land in weights.json too (``architectures``, ``model_type``, ``max_model_len``
    are read back by the engines' /model_info and /v1/models).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    payload = {"name": name, "seed": seed, **extra}
    tmp = root / f".{WEIGHTS_FILE}.tmp"
    tmp.write_text(json.dumps(payload, sort_keys=True) + "\n")
    # Atomic rename: an engine reading concurrently sees the old or the new weights, never half.
    tmp.replace(root / WEIGHTS_FILE)
    return root


def load_checkpoint(path: str) -> Checkpoint:
    """Hash a checkpoint directory. Blocking file I/O: call it from a worker thread."""
    root = Path(path)
    try:
        is_dir = root.is_dir()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte: the real engine's 400 too
        raise CheckpointNotFound(f"{exc}: '{path[:256]}'") from None
    if not is_dir:
        raise CheckpointNotFound(f"[Errno 2] No such file or directory: '{path}'")
    h = hashlib.blake2b(digest_size=16)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    for file in files[:_MAX_FILES]:
        rel = file.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + str(file.stat().st_size).encode() + b"\0")
        with file.open("rb") as f:
            h.update(f.read(_MAX_BYTES_PER_FILE))
    meta: dict[str, Any] = {}
    weights = root / WEIGHTS_FILE
    if weights.is_file():
        try:
            meta = json.loads(weights.read_text())
        except ValueError:
            meta = {}
    return Checkpoint(
        path=str(path),
        digest=h.hexdigest(),
        name=str(meta.get("name", root.name)),
        architectures=tuple(meta.get("architectures", ("Qwen3ForCausalLM",))),
        model_type=str(meta.get("model_type", "qwen3")),
        max_model_len=int(meta.get("max_model_len", 40960)),
    )


def startup_checkpoint(path: str) -> Checkpoint:
    """What an engine loads at startup: a directory, or else a hub id hashed by name.

    Real engines download ``Qwen/Qwen3-0.6B``-style ids; the fake accepts them at startup (only
    a refit from disk insists on a directory).
    """
    try:
        return load_checkpoint(path)
    except CheckpointNotFound:
        digest = hashlib.blake2b(path.encode(), digest_size=16).hexdigest()
        return Checkpoint(path=path, digest=digest, name=path)


def derived_digest(previous: str, *parts: Any) -> str:
    """The digest after an in-place update (distributed/tensor): previous weights + the update."""
    h = hashlib.blake2b(previous.encode(), digest_size=16)
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    return h.hexdigest()


def default_checkpoint(owner: object, name: str = DEFAULT_MODEL_NAME) -> Path:
    """A fresh checkpoint in a temporary directory removed when ``owner`` is garbage collected."""
    root = Path(tempfile.mkdtemp(prefix="smgrl-fake-ckpt-"))
    weakref.finalize(owner, shutil.rmtree, root, True)
    return make_checkpoint(root / name.replace("/", "--"), name)


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """The digest an engine computes when it loads ``path`` (raises CheckpointNotFound)."""
    return load_checkpoint(str(path)).digest
