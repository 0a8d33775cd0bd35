"""``ccpo collect`` and ``ccpo collect-exit``: traces from real OpenAI-compatible endpoints.

The options come from :class:`ccpo.llm.config.CollectConfig` (:func:`ccpo.cli.config.
settings_options`); the run itself is :func:`ccpo.llm.collect.collect`. Exit 0 when every
question is in the output, 1 when some failed or the budget stopped the run.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ccpo.cli.config import settings_options
from ccpo.cli.options import EXIT_FAILED, EXIT_OK, PricesOpt, quiet_http_logs
from ccpo.llm.collect import CollectSummary, collect
from ccpo.llm.config import CollectConfig, PolicyLLMSpec, build_config
from ccpo.traces.labels import GOLD, against_text

_err = Console(stderr=True)

_COMMON_HELP = (
    "Settings may also come from --config FILE (YAML, same names as the flags with '_'); flags "
    "override it. The output is append-only and resumable: rerun the same command to finish. "
    "Calls are cached in SQLite (default ~/.cache/ccpo/responses.sqlite), so reruns never pay "
    "twice."
)
COLLECT_HELP = "Collect base/guide traces (paper §3). " + _COMMON_HELP
COLLECT_EXIT_HELP = (
    "Collect LLM-EXIT traces: one model answers each round and decides [EXIT]/[CONTINUE]. "
    + _COMMON_HELP
)


ConfigOpt = Annotated[Path | None, typer.Option(help="YAML config file")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the summary as JSON")]
QuietOpt = Annotated[bool, typer.Option(help="no progress bar")]

EXIT_FLAGS = {
    "base_model": "--model",
    "base_url": "--url",
    "base_key_env": "--key-env",
    "stop_at_exit": "--stop-at-exit",
}
"""``collect-exit``'s flags for the settings of its single model (named after the base's)."""


def exit_code(s: CollectSummary) -> int:
    """0 when every question is in the output; 1 when some failed or the budget stopped the run
    (the output is then partial: rerun the same command to finish)."""
    return EXIT_OK if s.complete and not s.failed and not s.stopped_by_budget else EXIT_FAILED


def _print_summary(s: CollectSummary, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(s.to_dict()))
        return
    c = _err
    status = "complete" if s.complete else "incomplete"
    c.print(
        f"[bold]{s.out}[/bold]: {s.already + s.done}/{s.total} questions ({status}); "
        f"{s.done} new, {s.already} already present"
    )
    c.print(
        f"spent ${s.spent_usd:.4f} on {s.calls} calls; {s.cached} served by the cache; "
        f"{s.retries} retries"
    )
    if s.labels != GOLD:
        c.print(
            f"labels: {against_text(s.labels)} (it answered every question; any gold answers "
            "of the questions are not used)",
            highlight=False,
        )
    if s.dropped:
        c.print(
            f"[yellow]{len(s.dropped)} questions left out: the reference gave no answer "
            f"(nothing to agree with): {', '.join(s.dropped[:5])}"
            f"{' …' if len(s.dropped) > 5 else ''}"
        )
    if s.truncated_partial_line:
        c.print("removed a half-written last line (that question was redone)")
    if s.failed:
        c.print(
            f"[yellow]{len(s.failed)} questions failed (rerun to retry): "
            f"{', '.join(s.failed[:5])}{' …' if len(s.failed) > 5 else ''}"
        )
    if s.stopped_by_budget:
        c.print("[yellow]stopped at --max-cost; rerun with a larger budget to finish")


#: the settings both collect commands take as options (from CollectConfig, help and all)
_RUN = (
    "rounds", "n", "shuffle_seed", "concurrency", "workers", "max_cost",
    "search", "corpus", "max_steps", "max_tokens", "temperature_first", "temperature_later",
    "sample_offset", "cache", "no_cache", "timeout", "max_retries", "backoff_base",
    "http_backend", "out",
)  # fmt: skip
_BASE = ("base_model", "base_url", "base_key_env")
_GUIDE = ("guide_model", "guide_url", "guide_key_env", "coverage")
_LABELS = ("reference",)


def _tail(
    prices: PricesOpt = None,
    config: ConfigOpt = None,
    json_summary: JsonOpt = False,
    quiet: QuietOpt = False,
    settings: dict | None = None,
) -> None:
    """The options every collect command ends with (``settings``: the settings options)."""


def _collect_command(
    kind: str, flags: dict[str, str] | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Make ``func(cfg, **its options)`` the collect command of ``kind``: it takes ``func``'s
    options, then :func:`_tail`'s; builds the :class:`CollectConfig` (flags named as
    ``flags`` says), lets ``func`` complete it, collects and exits."""
    tail = list(inspect.signature(_tail, eval_str=True).parameters.values())

    def deco(func: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(func)
        def command(**kwargs: Any) -> None:
            prices, config = kwargs.pop("prices"), kwargs.pop("config")
            json_summary, quiet = kwargs.pop("json_summary"), kwargs.pop("quiet")
            cfg = build_config(config, _overrides(kwargs.pop("settings"), prices), flags)
            func(cfg, **kwargs)
            _run(cfg, kind, quiet, json_summary)

        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        command.__signature__ = inspect.Signature([*own, *tail])  # type: ignore[attr-defined]
        return command

    return deco


@settings_options(CollectConfig, ("task", "data", *_BASE, *_GUIDE, *_LABELS, *_RUN))
@_collect_command("base-guide")
def collect_cmd(
    cfg: CollectConfig,
    policy_llm: str = typer.Option(None, help="also record LLM-as-policy decisions"),
    policy_llm_url: str = typer.Option(None, help="endpoint of the policy LLM"),
    policy_llm_key_env: str = typer.Option(None, help="env var with its API key"),
) -> None:
    if policy_llm:
        spec = PolicyLLMSpec(model=policy_llm, url=policy_llm_url, key_env=policy_llm_key_env)
        cfg.policy_llm = [p for p in cfg.policy_llm if p.model != policy_llm] + [spec]


@settings_options(
    CollectConfig, ("task", "data", *_BASE, "stop_at_exit", *_LABELS, *_RUN), EXIT_FLAGS
)
@_collect_command("llm-exit", EXIT_FLAGS)
def collect_exit_cmd(cfg: CollectConfig) -> None:
    """No options of its own: its settings name one model (:data:`EXIT_FLAGS`)."""


def _overrides(settings: dict | None, prices: list[Path] | None) -> dict:
    return {**(settings or {}), "prices": [str(p) for p in prices or []] or None}


def _run(cfg: CollectConfig, kind: str, quiet: bool, json_summary: bool) -> None:
    """Collect, print the summary, exit with :func:`exit_code`."""
    quiet_http_logs()
    s = collect(cfg, kind, progress=not quiet)
    _print_summary(s, json_summary)
    raise typer.Exit(exit_code(s))


def register(app: typer.Typer) -> None:
    """Add ``collect`` and ``collect-exit`` to ``app``."""
    app.command("collect", help=COLLECT_HELP)(collect_cmd)
    app.command("collect-exit", help=COLLECT_EXIT_HELP)(collect_exit_cmd)
