#!/usr/bin/env python3
"""Trainer-driven refit of a mixed SGLang/TokenSpeed fleet through smgrl (the NCCL/gloo path).

    python examples/refit_from_trainer.py --gateway http://127.0.0.1:30000 --weight-version 8 \
        --master-address 10.0.0.1 [--master-port 0] [--selector health=ready] [--api-key KEY] \
        [--backend gloo|nccl] [--tensors 8] [--chunks 3] [--skip-tensors]

The trainer is rank 0 of a ``torch.distributed`` group that every selected engine joins; it then
broadcasts the new weights to them. Every control call goes through the gateway (SGLang over its
HTTP URL, TokenSpeed through its ``rl.control_url``), so the journal records the whole refit:

1. rank offsets: engine i gets ``rank_offset = 1 + sum(tp_size of engines before it)``, and the
   group's ``world_size = 1 + sum(tp_size)`` (``tp_size: null``, as a bare TokenSpeed launch
   reports, counts as 1);
2. inside ``paused()`` (each engine's default pause mode: SGLang ``abort``, TokenSpeed ``wait``):
   ``init_weights_update_group`` per engine with its own offset, while the trainer joins as rank 0;
   ``begin_weight_update`` on SGLang engines (0.5.23 refuses distributed updates outside one);
   ``update_weights_from_distributed`` fanned out once per chunk while the trainer broadcasts that
   chunk's tensors, the ``weight_version`` (and ``flush_cache``) on the last chunk only;
   ``end_weight_update`` on SGLang engines; ``destroy_weights_update_group`` (also after a failure);
3. check: every row reports the new version and, where an engine exposes what it received (the
   fake engines' ``GET /_fake/weights``), its checksums match what the trainer sent.

Without torch (or with ``--skip-tensors``) the same control sequence runs and no tensor is sent:
engines started without real transfers accept the metadata alone. Real engines need the tensors.

With ``--saga`` (smgrl only) the gateway's refit saga runs the engine side (docs/refits.md):
``POST /v1/rl/refits`` with a distributed source, the chunks through
``POST /v1/rl/refits/{id}/transfer`` while the trainer broadcasts, then ``commit``.

Refuses (exit 2) a loopback ``--master-address`` when the gateway or any engine is not on
loopback: the engines would try to reach the trainer at their own loopback address. Exit 0 when
the refit took, 1 when it did not. Works against SMG 1.13.0 with ``from smg.rl import ...``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import ipaddress
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from smgrl.rl import RL, RefitError, RlError, Worker, paused

SGLANG_SESSION = "sglang"  # engines whose distributed updates need begin/end_weight_update


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(url: str | None) -> str | None:
    return urllib.parse.urlsplit(url).hostname if url else None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_offsets(workers: Sequence[Worker]) -> tuple[dict[str, int], int]:
    """{worker id: rank_offset} and the world size; the trainer is rank 0."""
    offsets, next_rank = {}, 1
    for w in workers:
        offsets[w.id] = next_rank
        next_rank += w.tp_size or 1
    return offsets, next_rank


def id_selector(workers: Sequence[Worker]) -> str:
    return f"id in ({','.join(w.id for w in workers)})"


# -- the trainer's side of the collective (torch only) -------------------------------------------


def torch_or_none():
    try:
        import torch
        import torch.distributed
    except ImportError:
        return None
    return torch if torch.distributed.is_available() else None


def make_tensors(torch, version: str, count: int) -> dict[str, Any]:
    """Deterministic stand-ins for a model's parameters (fp32 and bf16)."""
    gen = torch.Generator().manual_seed(int(hashlib.sha256(version.encode()).hexdigest()[:8], 16))
    out = {}
    for i in range(count):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        out[f"model.layers.{i}.mlp.weight"] = torch.randn(32, 16 + i, generator=gen).to(dtype)
    return out


def fake_tensors(count: int) -> dict[str, tuple[str, list[int]]]:
    """The same names, dtypes and shapes as make_tensors, without torch."""
    return {
        f"model.layers.{i}.mlp.weight": ("float32" if i % 2 == 0 else "bfloat16", [32, 16 + i])
        for i in range(count)
    }


def checksum(tensor) -> str:
    """SHA-256 of the raw bytes (what the fake engines keep per received tensor)."""
    import ctypes

    flat = tensor.detach().cpu().contiguous()
    return hashlib.sha256(ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())).hexdigest()


def join_as_rank0(master: str, port: int, world: int, group: str, backend: str, timeout_s: float):
    """Create the trainer's member (rank 0) of the weight-update group, the way SGLang's and slime's
    ``init_custom_process_group`` do: TCP rendezvous, a store prefixed with the group name."""
    import inspect

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world, rendezvous

    timeout = timedelta(seconds=timeout_s)
    host = f"[{master}]" if ":" in master else master
    store, rank, world = next(rendezvous(f"tcp://{host}:{port}", 0, world, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(group, store)
    # torch 2.6 renamed pg_options to backend_options.
    params = inspect.signature(_new_process_group_helper).parameters
    options = {"backend_options" if "backend_options" in params else "pg_options": None}
    pg, _ = _new_process_group_helper(
        world, rank, [], Backend(backend), store, group_name=group, timeout=timeout, **options
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


def alongside(trainer_part: Callable[[], Any] | None, gateway_part: Callable[[], Any], timeout: float):
    """Run the trainer's part of a collective in a thread while the gateway call (which returns only
    once the engines took their part) runs here; returns (gateway result, trainer result).

    The thread is a daemon: if the gateway call fails, the trainer's half-finished collective
    cannot keep the process alive (it gives up at the group timeout on its own).
    """
    if trainer_part is None:
        return gateway_part(), None
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = trainer_part()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the main thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="trainer-rank0")
    thread.start()
    result = gateway_part()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the trainer's side of the collective did not finish within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return result, box.get("value")


# -- the refit -------------------------------------------------------------------------------------


class RefitFailed(Exception):
    """An engine refused a step (exit 1)."""


class Refused(Exception):
    """The fleet cannot be refit this way (exit 2); nothing was changed."""


def check_targets(workers: Sequence[Worker], master: str) -> None:
    problems = [
        f"{w.id} ({w.engine}): capabilities do not list distributed updates"
        for w in workers
        if "distributed" not in w.capabilities.get("update_from", [])
    ]
    if is_loopback(master):
        problems += [
            f"{w.id} ({w.engine}) is controlled at {w.control_url}, not on this host: it cannot reach "
            f"the loopback --master-address {master}"
            for w in workers
            if not is_loopback(host_of(w.control_url))
        ]
    if problems:
        raise Refused("\n  ".join(problems))


def init_groups(rl: RL, workers, offsets, world, args, port) -> None:
    """``init_weights_update_group`` on every engine at once: each blocks until all ranks joined."""

    def init(w: Worker):
        body = {
            "master_address": args.master_address,
            "master_port": port,
            "rank_offset": offsets[w.id],
            "world_size": world,
            "group_name": args.group_name,
            "backend": args.backend,
        }
        # Bounded like the trainer's side: a rank that never joins must not hold us for the
        # engine's own rendezvous timeout.
        return w, rl.call(w.id, "init_weights_update_group", body, timeout=args.dist_timeout)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(workers)) as pool:
            results = list(pool.map(init, workers))
    except TimeoutError:
        raise RefitFailed(
            f"init_weights_update_group: not every engine answered within {args.dist_timeout:g}s "
            "(did every rank join the group?)"
        ) from None
    for w, r in results:
        print(f"  init_weights_update_group {w.engine} {w.id}: rank_offset {offsets[w.id]} -> {r.status}")
    bad = [(w, r) for w, r in results if r.status != 200]
    if bad:
        raise RefitFailed(f"init_weights_update_group failed on {[w.id for w, _ in bad]}: {bad[0][1].body}")


def weights(args, torch) -> tuple[dict[str, Any], dict[str, tuple[str, list[int]]]]:
    if torch is None:
        return {}, fake_tensors(args.tensors)
    tensors = make_tensors(torch, args.weight_version, args.tensors)
    return tensors, {n: (str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors.items()}


def refit(rl: RL, rows: list[Worker], args, torch) -> tuple[list[Worker], dict[str, str]]:
    """Pause what ``--selector`` picks, refit exactly those engines, resume them (always).

    Returns the engines refit and {tensor name: checksum} of what was broadcast."""
    tensors, meta = weights(args, torch)
    names = list(meta)
    chunks = [names[i :: args.chunks] for i in range(args.chunks) if names[i :: args.chunks]]
    with paused(rl, args.selector) as pause:
        # The pause fan-out's targets are the gateway's reading of the selector: refit those.
        workers = [w for w in rows if w.id in pause.results]
        print(
            f"paused {pause.succeeded}/{pause.total}: "
            + ", ".join(f"{w.engine}(tp={w.tp_size})" for w in workers)
        )
        check_targets(workers, args.master_address)
        selector = id_selector(workers)
        sessions = [w for w in workers if w.engine == SGLANG_SESSION]
        offsets, world = rank_offsets(workers)
        port = args.master_port or free_port(args.master_address)
        print(f"group {args.group_name!r}: world_size {world}, master {args.master_address}:{port}")
        pg = None
        session_open = False
        try:

            def rank0():
                return join_as_rank0(
                    args.master_address, port, world, args.group_name, args.backend, args.dist_timeout
                )

            _, pg = alongside(
                rank0 if torch is not None else None,
                lambda: init_groups(rl, workers, offsets, world, args, port),
                args.dist_timeout,
            )
            if sessions:
                rl.fanout("begin_weight_update", {}, selector=id_selector(sessions))
                session_open = True
            for i, chunk in enumerate(chunks):
                last = i == len(chunks) - 1
                body: dict[str, Any] = {
                    "names": chunk,
                    "dtypes": [meta[n][0] for n in chunk],
                    "shapes": [meta[n][1] for n in chunk],
                    "group_name": args.group_name,
                    "flush_cache": last,
                }
                if last:
                    body["weight_version"] = args.weight_version

                result, _ = alongside(
                    broadcaster(tensors, chunk, args.backend, pg),
                    lambda body=body: rl.fanout(
                        "update_weights_from_distributed", body, selector=selector, timeout=args.dist_timeout
                    ),
                    args.dist_timeout,
                )
                print(
                    f"  chunk {i + 1}/{len(chunks)}: {len(chunk)} tensors -> {result.succeeded}/{result.total}"
                )
            if session_open:
                rl.fanout("end_weight_update", {}, selector=id_selector(sessions))
                session_open = False
        finally:
            # Leave no group (and no open SGLang session) behind; a failure here is secondary.
            with contextlib.suppress(RlError):
                if session_open:
                    rl.fanout("end_weight_update", {}, selector=id_selector(sessions), allow_partial=True)
            with contextlib.suppress(RlError):
                rl.fanout(
                    "destroy_weights_update_group",
                    {"group_name": args.group_name},
                    selector=selector,
                    allow_partial=True,
                )
            if pg is not None:
                import torch.distributed as dist

                with contextlib.suppress(Exception):
                    dist.destroy_process_group(pg)
    sent = {n: checksum(t) for n, t in tensors.items()} if pg is not None else {}
    return workers, sent


def broadcaster(tensors, chunk, backend: str, pg):
    """Rank 0's half of one chunk: broadcast its tensors to the group (None without a group)."""
    if pg is None:
        return None

    def broadcast() -> None:
        import torch.distributed as dist

        for n in chunk:
            tensor = tensors[n].cuda() if backend == "nccl" else tensors[n]
            dist.broadcast(tensor, src=0, group=pg)

    return broadcast


def refit_saga(rl: RL, args, torch) -> tuple[list[Worker], dict[str, str]]:
    """The same refit run by the gateway's refit saga (``--saga``; smgrl only, docs/refits.md):
    the gateway pauses, joins every engine to the group and begins; the trainer broadcasts each
    chunk while ``POST /v1/rl/refits/{id}/transfer`` makes every engine kind take it; ``commit``
    finishes, versions, verifies and resumes. A failure quarantines the engines (never resumed on
    unknown weights)."""
    tensors, meta = weights(args, torch)
    names = list(meta)
    chunks = [names[i :: args.chunks] for i in range(args.chunks) if names[i :: args.chunks]]
    port = args.master_port or free_port(args.master_address)
    source = {
        "master_address": args.master_address,
        "master_port": port,
        "group_name": args.group_name,
        "backend": args.backend,
    }
    if torch is not None:
        # The engines whose kind has a per-tensor checksum route (vLLM) compare them after the
        # load; a mismatch fails that engine's load (docs/refits.md, Verification).
        source["checksums"] = {n: checksum(t) for n, t in tensors.items()}
    record = rl.start_refit(
        args.selector, args.weight_version, distributed=source, transfer_timeout_secs=args.dist_timeout
    )
    refit_id, info = record["refit_id"], record["transfer"]
    print(
        f"refit {refit_id}: group {info['group_name']!r}, world_size {info['world_size']}, ranks {info['ranks']}"
    )
    pg = None
    if torch is not None:
        # Rank 0 joins while the saga's init calls make the engines join (the rendezvous).
        pg = join_as_rank0(
            args.master_address, port, info["world_size"], args.group_name, args.backend, args.dist_timeout
        )
    deadline = time.monotonic() + args.dist_timeout
    while (state := rl.refit_status(refit_id))["state"] != "awaiting_transfer":
        if state["result"] is not None or time.monotonic() > deadline:
            raise RefitFailed(f"refit {refit_id} did not reach awaiting_transfer: {state['state']}")
        time.sleep(0.05)
    try:
        for i, chunk in enumerate(chunks):
            result, _ = alongside(
                broadcaster(tensors, chunk, args.backend, pg),
                lambda chunk=chunk: rl.refit_transfer(
                    refit_id, chunk, [meta[n][0] for n in chunk], [meta[n][1] for n in chunk]
                ),
                args.dist_timeout,
            )
            ok = sum(1 for r in result["results"] if r["result"] == "ok")
            print(f"  chunk {i + 1}/{len(chunks)}: {len(chunk)} tensors -> {ok}/{len(result['results'])}")
            if ok != len(result["results"]):
                rl.fail_refit(refit_id, f"chunk {i + 1} failed on some engines")
                break
        else:
            rl.commit_refit(refit_id)
        final = rl.wait_refit(refit_id, progress=lambda r: print(f"  saga: {r['state']}"))
    finally:
        if pg is not None:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group(pg)
    ids = {e["worker_id"] for e in final["engines"]}
    sent = {n: checksum(t) for n, t in tensors.items()} if pg is not None else {}
    return [w for w in rl.workers() if w.id in ids], sent


def verify(rl: RL, workers: list[Worker], version: str, sent: dict[str, str]) -> bool:
    ok = True
    rows = {w.id: w for w in rl.workers()}
    for w in workers:
        got = rows[w.id].weight_version if w.id in rows else None
        ok = ok and got == version
        print(f"  {w.engine} {w.id}: weight_version {got!r}")
    if not sent:
        print("tensors skipped: control sequence only")
        return ok
    checked = 0
    for w in workers:
        reply = rl.call(w.id, "_fake/weights", method="GET")
        if reply.status != 200 or not isinstance(reply.body, dict) or "checksums" not in reply.body:
            print(f"  {w.id}: the engine does not expose what it received; not checked")
            continue
        if {n: reply.body["checksums"].get(n) for n in sent} != sent:
            ok = False
            print(f"  {w.id}: checksum MISMATCH", file=sys.stderr)
        else:
            checked += 1
    print(f"checksums verified on {checked}/{len(workers)} engines ({len(sent)} tensors)")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--weight-version", required=True)
    ap.add_argument("--selector", default="health=ready", help="the engines to refit (a gateway selector)")
    ap.add_argument(
        "--master-address", required=True, help="the trainer's address, reachable by every engine"
    )
    ap.add_argument("--master-port", type=int, default=0, help="0: a free port")
    ap.add_argument("--group-name", default="smgrl-refit")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--skip-tensors", action="store_true", help="control sequence only, even with torch")
    ap.add_argument("--dist-timeout", type=float, default=300.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--saga", action="store_true", help="let the gateway's refit saga run the engine side (smgrl only)"
    )
    args = ap.parse_args()
    if args.chunks < 1 or args.tensors < 1:
        ap.error("--chunks and --tensors must be at least 1")
    if is_loopback(args.master_address) and not is_loopback(host_of(args.gateway)):
        print(
            f"refusing loopback --master-address {args.master_address} with a gateway at {args.gateway}: "
            "the engines behind it cannot reach the trainer there",
            file=sys.stderr,
        )
        return 2

    rl = RL(args.gateway, api_key=args.api_key, timeout=args.timeout)
    torch = None if args.skip_tensors else torch_or_none()
    print(
        f"refit {args.selector!r} to {args.weight_version!r}; tensors "
        + (f"broadcast over {args.backend}" if torch is not None else "skipped")
    )
    try:
        workers, sent = refit_saga(rl, args, torch) if args.saga else refit(rl, rl.workers(), args, torch)
    except RefitError as exc:
        print(f"refit failed: {exc}", file=sys.stderr)
        return 1
    except Refused as exc:
        print(f"cannot refit:\n  {exc}", file=sys.stderr)
        return 2
    except (RlError, RefitFailed) as exc:
        # A FanoutError from smgrl.rl names every failed engine with its own reason.
        print(f"refit failed: {exc}", file=sys.stderr)
        return 1
    except TimeoutError as exc:
        print(f"refit failed: a step got no answer in time ({exc})", file=sys.stderr)
        return 1
    ok = verify(rl, workers, args.weight_version, sent)
    print("refit done" if ok else "refit did NOT take")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
