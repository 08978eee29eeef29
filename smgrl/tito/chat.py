"""The model's tokenizer and chat template, loaded the Hugging Face way from a model directory.

A model directory holds ``tokenizer.json`` (loaded with ``tokenizers``) and ``tokenizer_config.json``
(``chat_template``, ``bos_token``, ``eos_token``, ``added_tokens_decoder``); a ``chat_template.jinja``
file, when present, wins over the config's template (newer HF layout). The template runs in jinja2's
immutable sandbox with HF's conventions: ``trim_blocks``/``lstrip_blocks``, the loop-controls
extension, ``raise_exception``, ``strftime_now``, a ``tojson`` filter that keeps non-ASCII text,
and the variables ``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``, ``eos_token``
plus the request's ``chat_template_kwargs``.

Pure: loading reads two files (or an engine's tokenizer bundle, in memory); rendering and
tokenizing do no I/O.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import attrs

# Texts longer than this are encoded with the GIL released (``ChatTokenizer.encode``).
GIL_FREE_CHARS = 16_384


# What a tokenizer bundle is read for (the rest of the zip is ignored).
_BUNDLE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def _config_template(config: dict):
    source = config.get("chat_template")
    if isinstance(source, list):  # HF: a list of named templates; "default" is the chat one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    return source


class TitoError(Exception):
    """A bad model directory, template or request; ``code`` is the stable error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class TemplateError(TitoError):
    def __init__(self, message: str):
        super().__init__("chat_template_error", message)


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message):
    raise TemplateError(str(message))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def compile_template(source: str):
    from jinja2.exceptions import TemplateError as JinjaError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except JinjaError as e:
        raise TitoError("chat_template_invalid", f"chat template does not compile: {e}") from None


def _for_template(messages: Sequence[dict]) -> list[dict]:
    """Tool-call arguments arrive as JSON strings (OpenAI); templates expect objects (as vLLM and
    SGLang pass them). Unparseable arguments stay strings. The caller's messages are not changed."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            m = copy.deepcopy(m)
            for tc in m["tool_calls"]:
                f = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(f, dict) and isinstance(f.get("arguments"), str):
                    try:
                        f["arguments"] = json.loads(f["arguments"])
                    except ValueError:
                        pass
        out.append(m)
    return out


@attrs.define(eq=False)
class ChatTokenizer:
    """Tokenizer + chat template of one model. Thread-safe for rendering and encoding."""

    tokenizer: object  # tokenizers.Tokenizer
    template: object  # jinja2.Template
    bos_token: str | None
    eos_token: str | None
    eos_id: int | None
    special_ids: frozenset[int]
    name: str = ""
    # Where it was loaded from and a digest of the files read (``load``): a worker process loads
    # the same tokenizer by path and proves it read the same bytes (smgrl/sessions/offload.py).
    # Empty when built from parts in memory.
    source: str = ""
    fingerprint: str = ""

    @classmethod
    def load(cls, path) -> ChatTokenizer:
        from tokenizers import Tokenizer

        path = Path(path)
        tj, tc = path / "tokenizer.json", path / "tokenizer_config.json"
        if not tj.is_file() or not tc.is_file():
            raise TitoError("tokenizer_not_found", f"{path} needs tokenizer.json and tokenizer_config.json")
        digest = hashlib.blake2b(digest_size=16)
        try:
            raw = tj.read_bytes()
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
            config_raw = tc.read_bytes()
            config = json.loads(config_raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - any parse failure is one clear startup error
            raise TitoError("tokenizer_invalid", f"cannot load tokenizer from {path}: {e}") from None
        digest.update(
            len(raw).to_bytes(8, "little") + raw + len(config_raw).to_bytes(8, "little") + config_raw
        )
        source = None
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            source = jinja_file.read_text(encoding="utf-8")
            digest.update(b"J" + source.encode("utf-8", "surrogatepass"))
        else:
            source = _config_template(config)
        if not isinstance(source, str) or not source:
            raise TitoError("chat_template_missing", f"{path} has no chat template")
        chat = cls.from_parts(tokenizer, source, config, name=path.name)
        chat.source = str(path.resolve())
        chat.fingerprint = digest.hexdigest()
        return chat

    @classmethod
    def from_bundle(cls, data: bytes, name: str = "") -> ChatTokenizer:
        """From an engine's tokenizer bundle (the zip GetTokenizer streams): its
        ``tokenizer.json`` and ``tokenizer_config.json``, the template from ``chat_template.jinja``,
        else ``chat_template.json`` (HF's ``{"chat_template": ...}``), else the config's. Read in
        memory: nothing is written to disk."""
        import io
        import zipfile

        from tokenizers import Tokenizer

        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                names = set(zf.namelist())
                if not {"tokenizer.json", "tokenizer_config.json"} <= names:
                    raise TitoError(
                        "tokenizer_not_found", "the bundle needs tokenizer.json and tokenizer_config.json"
                    )
                files = {n: zf.read(n).decode("utf-8") for n in names if n in _BUNDLE_FILES}
            tokenizer = Tokenizer.from_str(files["tokenizer.json"])
            config = json.loads(files["tokenizer_config.json"])
            source = files.get("chat_template.jinja")
            if source is None and "chat_template.json" in files:
                source = json.loads(files["chat_template.json"]).get("chat_template")
        except TitoError:
            raise
        except Exception as e:  # noqa: BLE001 - any parse failure is one clear error
            raise TitoError("tokenizer_invalid", f"cannot load the tokenizer bundle: {e}") from None
        if not isinstance(config, dict):
            raise TitoError("tokenizer_invalid", "the bundle's tokenizer_config.json is not an object")
        source = source or _config_template(config)
        if not isinstance(source, str) or not source:
            raise TitoError("chat_template_missing", "the tokenizer bundle has no chat template")
        return cls.from_parts(tokenizer, source, config, name=name)

    @classmethod
    def from_parts(cls, tokenizer, template_source: str, config: dict, name: str = "") -> ChatTokenizer:
        eos = _token_text(config.get("eos_token"))
        special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        special |= {int(k) for k, v in (config.get("added_tokens_decoder") or {}).items() if v.get("special")}
        return cls(
            tokenizer=tokenizer,
            template=compile_template(template_source),
            bos_token=_token_text(config.get("bos_token")),
            eos_token=eos,
            eos_id=tokenizer.token_to_id(eos) if eos else None,
            special_ids=frozenset(special),
            name=name,
        )

    def render(
        self,
        messages: Sequence[dict],
        *,
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = False,
        kwargs: dict | None = None,
    ) -> str:
        from jinja2.exceptions import TemplateError as JinjaError

        variables = dict(kwargs or {})
        variables.update(
            messages=_for_template(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )
        try:
            return self.template.render(**variables)
        except TemplateError:
            raise
        except (JinjaError, TypeError, ValueError, KeyError, AttributeError) as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

    def encode(self, text: str) -> list[int]:
        """Ids of rendered text: special tokens in the text are recognised, none are added.

        A long text goes through ``encode_batch``: tokenizers' ``Tokenizer.encode`` keeps the GIL
        for its whole Rust call (measured: a 4 MB prompt held it for seconds, so the event loop
        stalled although the session service runs this in a worker thread), while
        ``encode_batch`` releases it around the same work (``py.allow_threads``); same ids."""
        if len(text) > GIL_FREE_CHARS:
            return self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def tokenize_messages(
        self, messages, *, tools=None, kwargs=None, add_generation_prompt=True
    ) -> list[int]:
        """Full re-tokenization: render the whole conversation, encode it."""
        return self.encode(
            self.render(messages, tools=tools, kwargs=kwargs, add_generation_prompt=add_generation_prompt)
        )
