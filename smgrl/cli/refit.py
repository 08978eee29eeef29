"""``smgrl refit``: run a disk refit through a gateway's saga and show it phase by phase.

Exit 0 when every engine resumed on the new version; 1 when the refit ended otherwise (each
engine that did not is named, one per line, with how it ended and its first failure: the
engine's own refusal of the load, even after a rollback); 2 when the gateway refused it (the
reason printed, e.g. engines whose kind cannot load from disk, a checkpoint missing here).
"""

from __future__ import annotations

import sys
import urllib.error

import click

from smgrl.cli.help import CONTEXT
from smgrl.core import escape as safe
from smgrl.rl import RL, GatewayUnreachable, RefitError, RlError

BAR = 20


def _bar(done: int, total: int) -> str:
    filled = BAR * done // total if total else BAR
    return "#" * filled + "." * (BAR - filled)


class Progress:
    """One line per phase as it advances: ``load   [####........] 3/8``; failures named."""

    def __init__(self, out) -> None:
        self.out = out
        self.shown: dict[str, tuple[int, int]] = {}
        self.state = None

    def __call__(self, record: dict) -> None:
        if record.get("state") != self.state:
            self.state = record.get("state")
            self.out(f"refit {safe(record['refit_id'])}: {safe(str(self.state))}")
        engines = record.get("engines", [])
        total = len(engines)
        phases: list[str] = []
        for plan in record.get("plan", {}).values():
            for step in plan.get("steps", []):
                if step["phase"] not in phases:
                    phases.append(step["phase"])
        for phase in phases:
            done = sum(1 for e in engines if phase in e.get("done", []))
            if done and self.shown.get(phase) != (done, total):
                self.shown[phase] = (done, total)
                self.out(f"  {phase:<8} [{_bar(done, total)}] {done}/{total}")


def _gateway_url(ctx, param, value: str) -> str:
    """A URL the client can use: ``127.0.0.1:30000`` gets a usage error saying what to write."""
    if value and not value.lower().startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} needs http:// or https:// (e.g. http://{value})")
    return value


@click.command("refit", context_settings=CONTEXT)
@click.option(
    "--gateway", required=True, callback=_gateway_url, help="The gateway's base URL (http://HOST:PORT)."
)
@click.option("--selector", required=True, help="Which engines (a /v1/rl label selector).")
@click.option("--model-path", required=True, help="The checkpoint directory every engine loads.")
@click.option("--version", "weight_version", required=True, help="The weight version to publish.")
@click.option("--api-key", envvar="SMGRL_API_KEY", default=None, help="A control-plane admin key.")
@click.option("--pause-mode", default=None, help="Override each engine kind's default pause mode.")
@click.option(
    "--on-failure",
    type=click.Choice(["quarantine", "rollback", "abort"]),
    default="quarantine",
    show_default=True,
    help="An engine whose load fails: hold it out, roll the fleet back, or stop.",
)
@click.option("--force", is_flag=True, help="Allow a version the fleet already left.")
@click.option("--no-flush", is_flag=True, help="Do not flush the engines' caches.")
@click.option("--timeout", type=float, default=None, help="Give up waiting after this many seconds.")
def refit_command(
    gateway, selector, model_path, weight_version, api_key, pause_mode, on_failure, force, no_flush, timeout
):
    """Refit engines from a checkpoint directory through the gateway's refit saga."""
    rl = RL(gateway, api_key=api_key)
    progress = Progress(click.echo)
    try:
        final = rl.refit(
            selector,
            weight_version,
            model_path=model_path,
            progress=progress,
            timeout=timeout,
            pause_mode=pause_mode,
            on_failure=on_failure,
            force=force,
            flush=not no_flush,
        )
    except RefitError as exc:
        click.echo(
            f"refit {safe(str(exc.refit.get('refit_id')))} ended {safe(str(exc.refit.get('result')))}:"
        )
        if exc.refit.get("detail"):
            click.echo(f"  {safe(str(exc.refit['detail']))}")
        for e in exc.refit.get("engines", []):
            if e.get("status") != "resumed":
                # Its first failure (the load's own error, even after a rollback), then how it ended.
                why = e.get("failure") or e.get("detail") or "-"
                click.echo(
                    f"  {safe(e['worker_id'])} {safe(str(e.get('url')))}: {safe(str(e.get('status')))}: {safe(str(why))}"
                )
        sys.exit(1)
    except RlError as exc:
        click.echo(
            f"error: the gateway refused the refit: {safe(str(exc.payload.get('error')))}: "
            f"{safe(str(exc.payload.get('message')))}",
            err=True,
        )
        sys.exit(2)
    except GatewayUnreachable as exc:  # names the URL and what to check
        click.echo(f"error: {safe(str(exc))}", err=True)
        sys.exit(1)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        click.echo(f"error: the gateway at {safe(gateway)} did not answer ({safe(str(exc))})", err=True)
        sys.exit(1)
    click.echo(
        f"refit {safe(final['refit_id'])} succeeded: {len(final['engines'])} engine(s) on {safe(weight_version)}"
    )
