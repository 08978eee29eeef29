#!/usr/bin/env python3
"""Refit a fleet from a checkpoint on disk through smgrl, then check that it took.

    python examples/refit_from_disk.py --gateway http://127.0.0.1:30000 \
        --model-path /tmp/ckpt/step-42 --weight-version 42 [--selector engine=sglang] [--api-key KEY]

``--model-path`` is a checkpoint directory every engine can read (for the fake engines, any
directory: ``mkdir -p /tmp/ckpt/step-42``).

Pause every selected engine, fan out ``update_weights_from_disk`` with the checkpoint and the new
``weight_version`` (``flush_cache: true``), resume (``paused()`` resumes even when the update
fails), then ask one engine to generate through the per-worker route and check that its
``meta_info.weight_version`` is the new version. Exit 0 when it is, 1 otherwise.

Works unchanged against SMG 1.13.0 with ``from smg.rl import ...`` (SGLang engines only).
"""

from __future__ import annotations

import argparse
import sys

from smgrl.rl import RL, RlError, paused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="http://127.0.0.1:30000")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--weight-version", required=True)
    ap.add_argument("--selector", default="engine=sglang")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()

    rl = RL(args.gateway, api_key=args.api_key, timeout=args.timeout)
    workers = rl.workers()
    if not workers:
        print("no workers registered", file=sys.stderr)
        return 1
    print(
        f"{len(workers)} workers; refitting '{args.selector}' to {args.weight_version} from {args.model_path}"
    )
    try:
        with paused(rl, args.selector) as pause:
            print(f"paused {pause.succeeded}/{pause.total}")
            result = rl.fanout(
                "update_weights_from_disk",
                {"model_path": args.model_path, "weight_version": args.weight_version, "flush_cache": True},
                selector=args.selector,
            )
            print(f"update_weights_from_disk: {result.succeeded}/{result.total} succeeded")
    except RlError as exc:
        # A FanoutError's text from smgrl.rl has one line per failed engine with the engine's own
        # reason (smg.rl's names the worker ids only; exc.result has everything with either).
        print(f"refit failed: {exc}", file=sys.stderr)
        return 1

    target = workers[0].id
    reply = rl.call(target, "generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
    version = reply.body.get("meta_info", {}).get("weight_version") if isinstance(reply.body, dict) else None
    print(f"generate on {target}: status {reply.status}, weight_version {version!r}")
    return 0 if reply.status == 200 and version == args.weight_version else 1


if __name__ == "__main__":
    sys.exit(main())
