"""The gateway process's collector settings (smgrl/runtime/gctune.py), each case in a fresh interpreter:
``tune`` and ``gc.freeze`` are process-wide, and this test process must keep its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_tune_raises_the_young_threshold_and_freezes_what_is_imported() -> None:
    got = _run(
        """
        import gc
        from smgrl.runtime import gctune
        middle, old = gc.get_threshold()[1:]
        gctune.tune()
        assert gc.get_threshold() == (gctune.YOUNG_THRESHOLD, middle, old), gc.get_threshold()
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen  # the modules imported so far
        state = [[i] for i in range(5000)]  # what startup builds after trio.run (lists: tracked)
        gctune.freeze_startup()
        assert gc.get_freeze_count() >= frozen + 5000, (frozen, gc.get_freeze_count())
        print("ok")
        """
    )
    assert got == "ok"


def test_freeze_startup_does_nothing_unless_the_process_was_tuned() -> None:
    # In-process servers (the tests) call serve() without run_gateway: nothing of theirs is frozen.
    got = _run(
        """
        import gc
        from smgrl.runtime import gctune
        threshold = gc.get_threshold()
        gctune.freeze_startup()
        print(gc.get_freeze_count(), gc.get_threshold() == threshold)
        """
    )
    assert got == "0 True"
