"""A small real tokenizer for tests, examples and benchmarks, built in process (nothing downloads).

``make_model_dir(path)`` trains a byte-level BPE with ``tokenizers`` on a few hundred in-memory
chat strings and saves it as a model directory the way Hugging Face does (``tokenizer.json`` +
``tokenizer_config.json`` with ``chat_template``, ``bos_token``, ``eos_token``). Two templates:

- ``chatml`` (append-only): per-message ChatML with Hermes/Qwen tool calls, like the TITO fork's
  own e2e template. Rendering a longer conversation only appends text.
- ``reasoning`` (not append-only): the same, but an assistant turn *before the last user message*
  loses its ``<think>...</think>`` block, as Qwen3-style reasoning templates do. A history that
  grows past a user message rewrites an earlier turn's text.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' }}'
    "{{- f.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role in ['system', 'user', 'developer'] %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- raise_exception('unknown role: ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Same as CHATML_TEMPLATE, except that an assistant message before the last user message is rendered
# without its reasoning block: appending a user turn rewrites the text of an earlier turn.
REASONING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{%- for message in messages %}",
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}",
).replace(
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}",
    "{%- set c = message.content or '' %}"
    "{%- if loop.index0 < ns.last_user and '</think>' in c %}"
    "{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if c %}{{- '\\n' + c }}{%- endif %}",
)

TEMPLATES = {"chatml": CHATML_TEMPLATE, "reasoning": REASONING_TEMPLATE}

_WORD_TEXT = (
    "the a to of and in is it you that he was for on are with as I his they be at one have this from "
    "or had by hot word but what some we can out other were all there when up use your how said an "
    "each she which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my over "
    "file read list run test error line code def return import python value true false null"
)
_WORDS = _WORD_TEXT.split()


def _corpus(seed: int = 0, n: int = 400) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        words = " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(3, 14)))
        args = json.dumps({"path": f"/tmp/f{i % 7}.py", "n": i % 13})
        out.append(f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n")
        out.append(f"<think>\n{words}\n</think>\n\n{words.capitalize()}.<|im_end|>\n")
        out.append(f'<tool_call>\n{{"name": "read_file", "arguments": {args}}}\n</tool_call><|im_end|>\n')
        out.append(f"<tool_response>\n{words} {i}\n</tool_response>")
    return out


def build_tokenizer(vocab_size: int = 600, seed: int = 0):
    """A trained byte-level BPE ``tokenizers.Tokenizer`` with the ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok


def make_model_dir(path, template: str = "chatml", *, vocab_size: int = 600) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (HF layout) into ``path``; return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    tok.save(str(path / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "special": True, "normalized": False} for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "added_tokens_decoder": added,
        "chat_template": TEMPLATES[template],
        "model_max_length": 32768,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path
