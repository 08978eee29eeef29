"""An engine's answer with its secrets masked (smgrl/core/redact.py): a table of cases."""

import json

import pytest

from smgrl.core.redact import redact_answer

CASES = [
    # (body, known keys, expected body)
    (b'{"api_key":null,"port":1}', (), b'{"api_key":null,"port":1}'),  # nothing set: same bytes
    (b'{"api_key": "s3cret", "port": 1}', (), {"api_key": "***", "port": 1}),
    (
        b'{"Admin_API_Key":"Adm1n","x":"--admin-api-key Adm1n"}',
        (),
        {"Admin_API_Key": "***", "x": "--admin-api-key ***"},
    ),
    (b'{"env":{"HF_TOKEN":"hf_x","PATH":"/bin"}}', (), {"env": {"HF_TOKEN": "***", "PATH": "/bin"}}),
    (b'[{"ssl_keyfile_password":"pw"},"pw"]', (), [{"ssl_keyfile_password": "***"}, "***"]),
    (b'{"cmd":"--api-key wk"}', ("wk", None), {"cmd": "--api-key ***"}),
    (
        b'{"eos_token":"<|im_end|>","max_total_num_tokens":5}',
        (),
        b'{"eos_token":"<|im_end|>","max_total_num_tokens":5}',
    ),
    (b"key=wk;", ("wk",), b"key=***;"),  # not JSON: the known keys cut out of the bytes
    (b"\xff\xfewk", ("wk",), b"\xff\xfe***"),
    (b"[" * 100_000, ("wk",), b"[" * 100_000),  # too deep to parse: as text
    (b'{"k":"abc","api_key":"b"}', (), {"k": "a***c", "api_key": "***"}),
]


@pytest.mark.parametrize(("body", "known", "expected"), CASES)
def test_redact_answer(body, known, expected):
    out = redact_answer(body, known)
    if isinstance(expected, bytes):
        assert out == expected
    else:
        assert json.loads(out) == expected
