"""Play turns through the pure core the way the session service does (no I/O)."""

from smgrl.tito.capture import assistant_message, captured, validate
from smgrl.tito.merge import prepare_turn
from smgrl.tito.store import CaptureTree, PrefixMismatch
from smgrl.tito.toolcalls import parser_for


def play_turn(
    chat, boundary, tree: CaptureTree, messages, output_ids, *, version="v1", tools=None, kwargs=None
):
    """One turn: prepare the prompt, 'generate' ``output_ids``, capture. Returns (plan, assistant)."""
    plan = prepare_turn(chat, boundary, messages, tools=tools, kwargs=kwargs, lookup=tree.lookup)
    assistant = assistant_message(chat, parser_for("hermes"), output_ids)
    report = validate(chat, boundary, plan.prompt_ids, chat.encode(plan.full_text)) if plan.hit else []
    tid = tree.reserve(plan.parent_hash)
    cap = captured(
        chat,
        plan,
        messages,
        assistant,
        tools=tools,
        kwargs=kwargs,
        output_ids=output_ids,
        output_logprobs=[-0.25 - 0.001 * i for i in range(len(output_ids))],
        finish_reason="stop" if output_ids and output_ids[-1] == chat.eos_id else "length",
        weight_version=version,
        engine="engine-a",
        mismatch_report=report,
    )
    try:
        tree.commit(tid, cap.hash, cap.parent, cap.token_ids, cap.record, cap.render_text)
    except PrefixMismatch:
        tree.commit(tid, cap.hash, None, cap.token_ids, cap.record, cap.render_text)
    return plan, assistant
