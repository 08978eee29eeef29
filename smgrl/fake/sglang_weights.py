"""SGLang's weight routes (docs/engines.md, SGLang): refits from disk, tensor and distributed,
process groups, begin/end sessions, weight versions, and memory release/resume.

A mixin of :class:`smgrl.fake.sglang.SGLangEngine` (it uses the engine's ``struct`` parser,
``lock``, ``scheduler`` and ``can_flush``). The rules it models:

* a refit takes the writer lock unless the engine is paused (so an un-paused refit waits for
  in-flight generations, or aborts them first with ``abort_all_requests``);
* ``flush_cache=true`` can refuse after the weights were replaced: 400 ``success: false``, and
  the weight version is then NOT recorded;
* distributed/tensor updates need a begin/end session (``require_weight_session``);
* releasing memory while busy, twice, or resuming what was not released is fatal in a real
  engine: a 500 here.
"""

from __future__ import annotations

from typing import Any

from smgrl.fake import body as b
from smgrl.fake.base import Reply
from smgrl.fake.checkpoint import CheckpointNotFound, derived_digest
from smgrl.fake.http import Request, Response, json_response, text_response

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
FLUSH_REFUSED_AFTER_LOAD = (
    "Weights were updated, but the cache was not flushed because requests are running or "
    "waiting. Pause generation (mode 'retract' or 'abort') first, or pass flush_cache=false "
    "and then call /flush_cache."
)
SESSION_REQUIRED = "{op} must run between begin_weight_update() and end_weight_update()."


class SGLangWeights:
    """Weight and memory routes; mixed into SGLangEngine (see the module docstring)."""

    async def _weights_op(self, abort_all: bool, op):
        if abort_all:
            self.scheduler.abort_all()
        if self.paused is not None:
            # Paused: the tokenizer manager skips the writer lock (in-place requests keep theirs).
            return await op()
        await self.lock.acquire_write()
        try:
            return await op()
        finally:
            self.lock.release_write()

    def _after_load(self, flush: bool) -> tuple[bool, str | None]:
        if not flush:
            return True, None
        if not self.can_flush():
            return False, FLUSH_REFUSED_AFTER_LOAD
        self.scheduler.flush_cache()
        return True, None

    def _require_session(self, op: str) -> None:
        if self.config.require_weight_session and not self.weight_session:
            raise Reply(json_response({"success": False, "message": SESSION_REQUIRED.format(op=op)}, 400))

    async def update_weights_from_disk(self, req: Request) -> Response:
        args = self.struct(req, {
            "model_path": (b.STR, b.REQUIRED), "load_format": (b.OPT_STR, None),
            "abort_all_requests": (b.BOOL, False), "weight_version": (b.OPT_STR, None),
            "flush_cache": (b.BOOL, True), "torch_empty_cache": (b.BOOL, False),
            "recapture_cuda_graph": (b.BOOL, False),
        })  # fmt: skip
        path = args["model_path"]

        async def load() -> tuple[bool, str]:
            try:
                checkpoint = await self.read_checkpoint(path)
            except CheckpointNotFound as exc:
                return False, f"Failed to get weights iterator: {exc}."
            self.install_weights(checkpoint.digest, checkpoint)
            flushed, refusal = self._after_load(args["flush_cache"])
            if not flushed:
                return False, refusal
            return True, "Succeeded to update model weights."

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        if ok:
            # Only a successful load renames the model (and so the /v1/models id).
            self.model_path = path
            self.served_model_name = path
            if args["load_format"] is not None:
                self.load_format = args["load_format"]
        if ok and self.knobs.fail_loads_after_swap > 0:
            # The weights and the version changed, and the caller is told it failed.
            self.knobs.fail_loads_after_swap -= 1
            if args["weight_version"] is not None:
                self.weight_version = args["weight_version"]
            self.changed.notify()
            return json_response(
                {"success": False, "message": "internal error after the load (fake knob)"}, 500
            )
        return self._weights_answer(ok, message, args["weight_version"], disk=True)

    def _weights_answer(self, ok: bool, message: str, version: str | None, disk: bool = False) -> Response:
        if ok and version is not None:
            # Recorded only when given AND the update succeeded.
            self.weight_version = version
            message += f" Weight version updated to {version}."
        payload: dict[str, Any] = {"success": ok, "message": self._dp(message)}
        if disk:
            paused = len(self.scheduler.waiting())
            payload["num_paused_requests"] = (
                [paused] * self.config.dp_size if self.config.dp_size > 1 else paused
            )
        self.changed.notify()
        return json_response(payload, 200 if ok else 400)

    async def update_weights_from_tensor(self, req: Request) -> Response:
        args = self.struct(req, {
            "serialized_named_tensors": (b.LIST, b.REQUIRED), "load_format": (b.OPT_STR, None),
            "flush_cache": (b.BOOL, True), "abort_all_requests": (b.BOOL, False),
            "weight_version": (b.OPT_STR, None), "selector": (b.STR, "all"),
        })  # fmt: skip
        self._assert_dp1()
        self._require_session("update_weights_from_tensor")

        async def load() -> tuple[bool, str]:
            self.install_weights(derived_digest(self.weights_digest, args["serialized_named_tensors"]))
            flushed, refusal = self._after_load(args["flush_cache"])
            return (True, "Success") if flushed else (False, refusal)

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        return self._weights_answer(ok, message, args["weight_version"])

    # Shaped like update_weights_from_tensor above: each route's own arguments and success text (SGLang's).
    async def update_weights_from_distributed(self, req: Request) -> Response:
        args = self.struct(req, {
            "names": (b.LIST, b.REQUIRED), "dtypes": (b.LIST, b.REQUIRED), "shapes": (b.LIST, b.REQUIRED),
            "group_name": (b.STR, "weight_update_group"), "flush_cache": (b.BOOL, True),
            "abort_all_requests": (b.BOOL, False), "weight_version": (b.OPT_STR, None),
            "load_format": (b.OPT_STR, None), "selector": (b.STR, "all"),
        })  # fmt: skip
        self._assert_dp1()
        self._require_session("update_weights_from_distributed")
        names, dtypes, shapes, group = args["names"], args["dtypes"], args["shapes"], args["group_name"]

        async def load() -> tuple[bool, str]:
            if not len(names) == len(dtypes) == len(shapes):
                return False, "names, dtypes and shapes must have the same length."
            if group not in self.transfers.groups:
                return False, (
                    f"Failed to update parameter online: '{group}'. The full weights of the "
                    "ModelRunner are partially updated. Please discard the whole weights."
                )
            sums = await self.transfers.receive(
                group,
                names,
                dtypes,
                shapes,
                corrupt=self.knobs.corrupt_transfers,
                weight_version=args["weight_version"],
            )
            self.install_weights(derived_digest(self.weights_digest, names, dtypes, shapes, sums))
            flushed, refusal = self._after_load(args["flush_cache"])
            return (True, "Succeeded to update parameter online.") if flushed else (False, refusal)

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        return self._weights_answer(ok, message, args["weight_version"])

    async def init_weights_update_group(self, req: Request) -> Response:
        args = self.struct(req, {
            "master_address": (b.STR, b.REQUIRED), "master_port": (b.INT, b.REQUIRED),
            "rank_offset": (b.INT, b.REQUIRED), "world_size": (b.INT, b.REQUIRED),
            "group_name": (b.STR, "weight_update_group"), "backend": (b.STR, "nccl"),
        })  # fmt: skip
        self._assert_dp1()
        try:
            await self.transfers.init_group(args["group_name"], args)
        except Exception as exc:  # noqa: BLE001 - a failed rendezvous is a 400, as in SGLang
            message = f"Failed to initialize custom process group: {exc}."
            return json_response({"success": False, "message": message}, 400)
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, req: Request) -> Response:
        args = self.struct(req, {"group_name": (b.STR, "weight_update_group")})
        self._assert_dp1()
        if not await self.transfers.destroy_group(args["group_name"]):
            return json_response(
                {"success": False, "message": "The group to be destroyed does not exist."}, 400
            )
        return json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def begin_weight_update(self, req: Request) -> Response:
        self.struct(req, {"selector": (b.STR, "all")})
        if self.weight_session:
            message = "A weight update session is already in progress; call end_weight_update() first."
            return json_response({"success": False, "message": message}, 400)
        self.weight_session = True
        return json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, req: Request) -> Response:
        self.struct(req, {})
        if not self.weight_session:
            message = "No weight update session in progress; call begin_weight_update() first."
            return json_response({"success": False, "message": message}, 400)
        self.weight_session = False
        return json_response({"success": True, "message": "Success"})

    async def update_weight_version(self, req: Request) -> Response:
        args = self.struct(req, {"new_version": (b.STR, b.REQUIRED), "abort_all_requests": (b.BOOL, True)})
        if args["abort_all_requests"]:
            self.scheduler.abort_all()
        version = args["new_version"]
        self.weight_version = version
        self.changed.notify()
        return json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def weights_checker(self, req: Request) -> Response:
        """``/weights_checker`` (docs/engines.md): ``checksum`` hashes all weights into one value per
        engine (``per_engine_checksum``) and keeps it; ``compare`` says whether the weights still
        hash to it; ``reset`` forgets it. One hash of everything: a trainer's per-tensor checksums
        cannot be compared with it (docs/refits.md, Verification)."""
        args = self.struct(req, {"action": (b.STR, b.REQUIRED)})
        action = args["action"]
        digest = derived_digest(self.weights_digest, sorted(self.transfers.checksums.items()))
        if action == "checksum":
            self._weights_baseline = digest
            return json_response({"success": True, "message": "Success", "per_engine_checksum": [digest]})
        if action == "reset":
            self._weights_baseline = None
            return json_response({"success": True, "message": "Success"})
        if action == "compare":
            base = getattr(self, "_weights_baseline", None)
            if base is None:
                return json_response({"success": False, "message": "no checksum to compare with"}, 400)
            same = base == digest
            message = "Success" if same else "weights differ from the last checksum"
            return json_response({"success": same, "message": message, "per_engine_checksum": [digest]})
        return json_response({"success": False, "message": f"unknown action {action!r}"}, 400)

    def _tags(self, req: Request) -> list[str]:
        tags = self.struct(req, {"tags": (b.OPT_LIST, None)})["tags"]
        return list(tags) if tags else list(MEMORY_TAGS)

    async def release_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        busy = self.paused is None and bool(self.scheduler.jobs)
        if busy or any(t not in MEMORY_TAGS or t in self.released_tags for t in tags):
            # An assert inside the scheduler process: a real engine most likely dies here.
            raise Reply(text_response("Internal Server Error", 500))
        self.release_memory(tags, "released")
        return json_response(None)

    async def resume_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        if any(t not in self.released_tags for t in tags):
            # set.remove -> KeyError in the scheduler: same caveat as above.
            raise Reply(text_response("Internal Server Error", 500))
        # Without a CPU backup the weight memory comes back uninitialised: refit next.
        self.resume_memory(tags, restore=self.config.enable_weights_cpu_backup)
        return json_response(None)
