"""The gRPC rollout translation, without sockets: incremental detokenization equals decoding the
whole (a property over random id sequences and chunkings); each wire's GenerateRequest carries
the fields its engine reads (the cap's name, the seed's, a DP pin where that wire keeps it);
stop strings cut the text and end the item."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.dataplane.grpc.build import Untranslatable, encoded, message, plan
from smgrl.dataplane.grpc.detok import Detokenizer
from smgrl.dataplane.grpc.render import GenItem, RenderedAnswer
from smgrl.tito import ChatTokenizer
from smgrl.tito.testkit import make_model_dir
from smgrl.upstream import WIRES


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return ChatTokenizer.load(make_model_dir(tmp_path_factory.mktemp("tok") / "chatml", "chatml"))


_TOK: list = []


def _tokenizer():
    if not _TOK:
        import tempfile

        _TOK.append(ChatTokenizer.load(make_model_dir(tempfile.mkdtemp() + "/m", "chatml")))
    return _TOK[0]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_incremental_detokenization_equals_decoding_the_whole(data):
    tok = _tokenizer()
    size = tok.tokenizer.get_vocab_size()
    ids = data.draw(st.lists(st.integers(0, size - 1), max_size=60))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=8)))

    def decode(x):
        return tok.tokenizer.decode(x, skip_special_tokens=True)

    detok = Detokenizer(decode)
    pieces, at = [], 0
    for cut in [*cuts, len(ids)]:
        pieces.append(detok.add(ids[at:cut]))
        at = cut
    pieces.append(detok.flush())
    assert "".join(pieces) == decode(ids)


def test_text_is_encoded_and_each_wire_names_its_fields(tok):
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 5, "sampling_seed": 3, "stop": "x"}}
    p = plan("/generate", body, tok)
    assert p.prompts == (tuple(tok.encode("hello")),) and not p.batch
    sg = message(WIRES["sglang"], p, 0, "r", 1)
    assert sg.sampling_params.max_new_tokens == 5 and sg.data_parallel_rank == 1
    ts = message(WIRES["tokenspeed"], p, 0, "r", None)
    assert ts.sampling_params.sampling_seed == 3 and not ts.HasField("data_parallel_rank")
    vl = message(WIRES["vllm"], p, 0, "r", 0)
    assert vl.sampling_params.max_tokens == 5 and vl.sampling_params.seed == 3
    assert vl.HasField("data_parallel_rank") and vl.data_parallel_rank == 0  # a pin to rank 0 kept
    ps = message(WIRES["vllm-psrl"], p, 0, "r", 1)
    assert ps.data_parallel_rank == 1 and list(ps.sampling_params.stop) == ["x"]
    # PSRL's fork numbers the rank 8: encoded with its messages it is not upstream's field 8.
    assert WIRES["vllm-psrl"].pb.GenerateRequest.DESCRIPTOR.fields_by_name["data_parallel_rank"].number == 8


def test_bad_bodies_are_a_clear_400_code():
    with pytest.raises(Untranslatable) as info:
        plan("/generate", {"text": "hi"}, None)
    assert info.value.code == "tokenizer_required"
    with pytest.raises(Untranslatable) as info:
        plan("/generate", {"input_ids": ["a"]}, None)
    assert info.value.code == "invalid_request"


def test_a_stop_string_cuts_the_text_and_ends_the_item(tok):
    p = plan("/generate", {"input_ids": [1, 2], "sampling_params": {"stop": ["lo w"]}}, tok)

    def decode(x):
        return tok.tokenizer.decode(x, skip_special_tokens=True)

    item = GenItem(p, 0, "r", "v3", decode)
    pb = WIRES["sglang"].pb
    ids = tok.encode("hello world again")
    _, delta = item.chunk(pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=2))
    assert delta == "hel" and item.stop_hit and item.text == "hel"
    assert item.finish == {"type": "stop", "matched": "lo w"}
    obj = item.generate_obj(True)
    assert (
        obj["meta_info"]["weight_version"] == "v3" and obj["meta_info"]["finish_reason"]["matched"] == "lo w"
    )


def test_the_final_stream_event_does_not_repeat_the_last_token(tok):
    p = plan("/generate", {"input_ids": [1, 2], "stream": True}, tok)
    pb = WIRES["tokenspeed"].pb
    item = GenItem(p, 0, "r", "old", None)
    answer = RenderedAnswer(p, [item], "m", "r")
    new, _ = item.chunk(pb.GenerateStreamChunk(token_ids=[7, 8], weight_version="v9"))
    assert new == [7, 8] and item.version == "v9"  # TokenSpeed names each chunk's weights
    new, _ = item.complete(pb.GenerateComplete(output_ids=[7, 8], finish_reason="length"), streamed=True)
    assert new == []  # the Complete frame's ids were all streamed already
    event = answer.event(item, new, "", True)
    assert b'"output_ids":[7,8]' in event and b'"finish_reason":{"type":"length","length":2}' in event


@pytest.mark.parametrize("wire", sorted(WIRES))
@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "temperature": 0.5, "stop": ["x"]}},
        {"input_ids": [[4, 5], [6]], "return_logprob": True, "top_logprobs_num": 2, "stream": True,
         "sampling_params": {"seed": 7, "stop_token_ids": [9], "regex": "a+", "min_new_tokens": 1}},
    ],
)  # fmt: skip
@pytest.mark.parametrize("dp_rank", [None, 0, 3])
def test_encoded_request_parses_to_the_message(wire, body, dp_rank):
    # The fast path serializes the shared fields once per plan and the per-call ones each
    # time: the bytes must parse to exactly the message built field by field, on every wire.
    p = plan("/generate", body, None)
    for index in range(len(p.prompts)):
        for _ in range(2):  # the second time from the cache
            fast = encoded(WIRES[wire], p, index, f"r{index}", dp_rank)
            want = message(WIRES[wire], p, index, f"r{index}", dp_rank)
            assert WIRES[wire].pb.GenerateRequest.FromString(fast.SerializeToString()) == want
            assert fast.request_id == f"r{index}"


def test_sampling_cache_tells_true_from_one():
    # A cached Sampling must not answer for a body whose values only compare equal (True == 1).
    assert plan("/generate", {"input_ids": [1], "sampling_params": {"top_k": 1}}, None).sampling.top_k == 1
    with pytest.raises(Untranslatable):
        plan("/generate", {"input_ids": [1], "sampling_params": {"top_k": True}}, None)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_buffered_answer_decoded_at_once_equals_the_incremental_text(data):
    tok = _tokenizer()
    ids = data.draw(st.lists(st.integers(0, tok.tokenizer.get_vocab_size() - 1), max_size=40))

    def decode(x):
        return tok.tokenizer.decode(x, skip_special_tokens=True)

    incremental = Detokenizer(decode)
    slow = incremental.add(ids) + incremental.flush()
    at_once = Detokenizer(decode)
    assert at_once.whole(ids) + at_once.flush() == slow == decode(ids)


def test_a_forked_gateway_draws_its_own_engine_request_ids():
    # Two gateways forked from one parent send to the same engines: their ids must differ
    # (Abort names a request by its id).
    import os

    from smgrl.core.ids import new_call_id

    parent = new_call_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, new_call_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child and child[:16] != parent[:16]  # its own prefix, not the parent's next id
