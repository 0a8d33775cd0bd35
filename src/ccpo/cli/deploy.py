"""``ccpo ask``, ``serve``, ``replay-server`` and ``dry-run``: a trained policy deployed.

- ``ask``: one question answered with live endpoints (:class:`ccpo.runtime.agent.ConformalAgent`);
- ``serve``: the HTTP service (:mod:`ccpo.runtime.server`);
- ``replay-server``: an OpenAI-compatible endpoint answering from a trace file's records;
- ``dry-run``: a policy answering its own logs live, checked against its replay
  (:mod:`ccpo.evaluation.dry_run`).

The deploy and server options come from :class:`ccpo.runtime.config.DeployConfig` and
:class:`~ccpo.runtime.config.ServerConfig`. See docs/deploy.md.
"""

from __future__ import annotations

import json
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ccpo.cli.config import settings_options
from ccpo.cli.options import EXIT_FAILED, PricesOpt, count, quiet_http_logs, warn
from ccpo.errors import CCPOError
from ccpo.llm import tracing
from ccpo.runtime.config import DeployConfig, ServerConfig, load_deploy_config
from ccpo.traces.io import written_whole

_out = Console()
_err = Console(stderr=True)

PolicyOpt = Annotated[Path, typer.Option("--policy", help="Trained policy folder (ccpo train).")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML deploy config (endpoints, prices, rails).")
]
#: the deployment settings ask and serve take as options (DeployConfig's scalar fields, help
#: and all; the API keys come from the config file only, the prices from --prices)
_DEPLOY = (
    "task",
    *(
        k
        for k in DeployConfig.model_fields
        if k not in ("task", "base_api_key", "guide_api_key", "prices", "server", "max_cost_total")
    ),
)
_ASK_FLAGS = {"max_cost_per_request": "--max-cost"}
#: the server settings serve takes as options (ServerConfig's scalar fields; the token itself
#: and the trusted proxies come from the config file only)
_SERVER = tuple(k for k in ServerConfig.model_fields if k not in ("auth_token", "trusted_proxies"))
_SERVER_FLAGS = {
    "adapt_kappa": "--adapt-kappa/--fixed-kappa",
    "auth_token_env": "--token-env",
    "rate_limit_per_minute": "--rate-limit",
}
T = TypeVar("T")


def _overrides(**kw: Any) -> dict[str, Any]:
    prices = kw.pop("prices", None)
    out = {k: v for k, v in kw.items() if v is not None}
    if prices:
        out["prices"] = [str(p) for p in prices]
    return out


def print_answer_set(s: Any, console: Console = _out) -> None:
    """The answer set, its cost and a compact per-round table."""
    g = s.guarantee
    single = g is not None and g.answer == "single"
    one = "(none)" if s.answer is None else repr(s.answer)
    console.print(
        f"[bold]answer[/bold]: {one}"
        + ("" if single else f" (the most likely of {len(s.answers)})"),
        highlight=False,
        soft_wrap=True,
    )
    if not single:
        answers = ", ".join(repr(a) for a in s.answers) or "(none)"
        console.print(
            f"[bold]answers[/bold] ({len(s.answers)}): {answers}", highlight=False, soft_wrap=True
        )
    if g is not None:
        console.print(f"guarantee: {g.statement}", highlight=False, soft_wrap=True)
    by_model = ", ".join(f"{m} ${c:.6f}" for m, c in s.cost_by_model.items())
    kappa = "greedy (point policy)" if s.kappa is None else f"κ = {s.kappa:.4f}"
    console.print(
        f"rounds {s.rounds}/{s.horizon}; cost ${s.cost_usd:.6f} ({by_model}); "
        f"α = {s.alpha:g}, {kappa}; {s.latency_ms:.0f} ms",
        highlight=False,
        soft_wrap=True,
    )
    t = Table(show_edge=False, pad_edge=False)
    for c in ("t", "base", "guide", "unc.", "π base/guide/next", "C(o_t)", "$"):
        t.add_column(c, justify="right" if c in ("t", "unc.", "$") else "left")
    for r in s.log:
        verdict = r.guide_verdict or "?"
        guide = "yes" if verdict == "yes" else f"{verdict}: {r.guide_answer}"
        t.add_row(
            str(r.round),
            _short(r.base_answer),
            _short(guide),
            "–" if r.uncertainty is None else f"{r.uncertainty:.2f}",
            "/".join(f"{r.pi[a]:.2f}" for a in ("base", "guide", "next")),
            "{" + ", ".join(r.actions) + "}" + (" ⤶" if r.fallback else ""),
            f"{r.cost_usd:.6f}",
        )
    console.print(t)


def printing_provenance(make: Callable[[], T]) -> T:
    """``make()`` (which builds a :class:`~ccpo.runtime.agent.ConformalAgent`, whose
    constructor checks the policy's provenance), its provenance warnings printed as
    ``warning:`` lines; any other warning goes on as usual."""
    from ccpo.runtime.agent import PolicyProvenanceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PolicyProvenanceWarning)
        made = make()
    for w in caught:
        if issubclass(w.category, PolicyProvenanceWarning):
            warn(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return made


def check_port_free(host: str, port: int, config_key: str | None = "server.port") -> None:
    """Refuse, in one line, to announce a server on an address another process holds; the
    hint names ``--port`` and the config key that sets it (None: the command has no config)."""
    try:
        socket.create_server((host, port)).close()  # SO_REUSEADDR, as uvicorn binds
    except OSError as e:
        also = f" or set {config_key} in the config" if config_key else ""
        raise CCPOError(
            f"cannot serve on {host}:{port}: {e.strerror or e} (another server there? pass "
            f"another --port{also})"
        ) from None


def _short(s: str, n: int = 28) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


@settings_options(DeployConfig, _DEPLOY, _ASK_FLAGS)
def ask_cmd(
    question: Annotated[str, typer.Argument(help="The question.")],
    policy: PolicyOpt,
    config: ConfigOpt = None,
    prices: PricesOpt = None,
    context: Annotated[
        Path | None,
        typer.Option(help="JSON file of paragraphs [{title, text}] (hotpotqa search)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the AnswerSet JSON.")] = False,
    settings: dict | None = None,
) -> None:
    """Answer one question with a trained policy and live endpoints: the answer set, its
    cost and the per-round log (base answer, guide verdict, π, the action set). With
    OTEL_EXPORTER_OTLP_ENDPOINT set, exports the question's OpenTelemetry trace, as serve
    does (pip install 'ccpo[otel]')."""
    from ccpo.runtime.agent import (
        BudgetExceeded,
        ConformalAgent,
        LLMCallError,
        RequestBudgetExceeded,
    )

    ctx = None
    if context is not None:
        try:
            ctx = json.loads(context.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CCPOError(f"{context}: cannot read the context JSON ({e})") from None
    over = _overrides(**(settings or {}), prices=prices)
    cfg = load_deploy_config(config, over, _ASK_FLAGS)
    tracing.configure_from_env()  # flushed when the command exits
    quiet_http_logs()
    with printing_provenance(lambda: ConformalAgent.from_artifact(policy, cfg)) as agent:
        try:
            if as_json:
                s = agent.answer(question, context=ctx)
                typer.echo(s.model_dump_json())
                return
            with _err.status("asking…"):
                s = agent.answer(question, context=ctx)
        except (LLMCallError, BudgetExceeded, RequestBudgetExceeded) as e:
            # the input was fine but the run failed (an endpoint, a budget): exit 1, not 2
            _err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_FAILED) from None
    print_answer_set(s)


def replay_server_cmd(
    traces: Annotated[
        Path, typer.Option("--traces", help="Trace file whose recorded outputs answer.")
    ],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 9000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    max_body_bytes: Annotated[
        int,
        typer.Option(help="Largest request body read, in bytes (larger: 413).", min=256),
    ] = 4 * 2**20,
) -> None:
    """An OpenAI-compatible endpoint that answers every model of a trace file from its
    recorded outputs (found by question text, model and round; recorded usage): dry-run a
    deployment against your own logs at zero API cost. Point every model at it in the
    deploy config (endpoints: {"*": {url: http://HOST:PORT/v1}}). A question or model that
    is not in the file gets HTTP 404, never an invented answer. Needs the serve extra."""
    import uvicorn

    from ccpo.runtime.http.connections import json_errors_protocol
    from ccpo.runtime.replay_server import ReplayIndex, create_replay_app

    check_port_free(host, port, None)
    with _err.status(f"indexing {traces}…"):
        index = ReplayIndex.from_file(traces)
    _err.print(
        f"ccpo replay-server: {index.n_questions} questions of {traces.name}; models "
        f"{', '.join(sorted(index.models))}; http://{host}:{port}/v1",
        highlight=False,
        soft_wrap=True,
    )
    if index.duplicates:
        warn(
            f"{index.duplicates} questions of {traces.name} repeat an earlier question's "
            "text; the replay endpoint finds a question by its text, so the first record "
            "answers them"
        )
    app = create_replay_app(index, max_body_bytes)
    http = json_errors_protocol()  # uvicorn's own 400s as the JSON error too
    uvicorn.run(app, host=host, port=port, log_level=log_level, http=http)


def dry_run_cmd(
    policy: PolicyOpt,
    traces: Annotated[
        Path, typer.Option("--traces", help="Trace file (your logs) to answer from.")
    ],
    config: ConfigOpt = None,
    prices: PricesOpt = None,
    n: Annotated[
        int | None, typer.Option("--n", min=1, help="Ask N questions (evenly spread).")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Questions in flight.")] = 16,
) -> None:
    """Answer the questions of a trace file live with a policy, every model of its ladder
    served from the file's recorded outputs (a replay endpoint in this process, zero API
    cost), and check each answer set against the policy's replay: answers, rounds, models
    paid and cost. Exit 0 when all are equal, 1 otherwise (each difference listed). Needs
    the serve extra."""
    from ccpo.evaluation.dry_run import dry_run
    from ccpo.llm.config import read_config_file

    values = read_config_file(config) if config else {}
    if prices:
        values["prices"] = [*values.get("prices", []), *(str(p) for p in prices)]
    values.pop("endpoints", None)
    quiet_http_logs()
    with _err.status("asking…") as status:
        report = printing_provenance(
            lambda: dry_run(
                policy,
                traces,
                values,
                n,
                concurrency,
                lambda k: status.update(f"asked {count(k, 'question')}…"),
            )
        )
    _out.print(
        f"{report.equal}/{report.questions} answer sets equal the policy's replay; "
        f"{count(report.calls, 'LLM call')}; cost ${report.live_cost_usd:.6f} live vs "
        f"${report.replay_cost_usd:.6f} replay; {report.seconds:.1f} s "
        f"({1000 * report.seconds / max(1, report.questions):.1f} ms per question)",
        highlight=False,
        soft_wrap=True,
    )
    for line in report.differences[:20]:
        _err.print(f"[red]differs:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@settings_options(DeployConfig, (*_DEPLOY, "max_cost_total"))
@settings_options(ServerConfig, _SERVER, _SERVER_FLAGS, "Server", prefix="server.")
def serve_cmd(
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            metavar="DIR",
            help="Trained policy folder (ccpo train). [required, except with --write-openapi]",
        ),
    ] = None,
    config: ConfigOpt = None,
    prices: PricesOpt = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    write_openapi: Annotated[
        Path | None, typer.Option(help="Write the OpenAPI spec to this file and exit.")
    ] = None,
    settings: dict | None = None,
) -> None:
    """Serve the policy over HTTP: POST /v1/answer, POST /v1/chat/completions
    (OpenAI-compatible, model 'ccpo'), POST /v1/feedback, GET /healthz, GET /metrics
    (Prometheus), GET /metrics.json (needs the extra: pip install 'ccpo[serve]'; see
    docs/deploy.md). With OTEL_EXPORTER_OTLP_ENDPOINT set, exports an OpenTelemetry trace
    per question over OTLP/HTTP (pip install 'ccpo[otel]')."""
    from ccpo.runtime import server  # a clear CCPOError without the extra (main escapes it)

    if write_openapi is not None:
        with written_whole(write_openapi) as tmp:  # a full disk leaves no half a file
            tmp.write_text(json.dumps(server.openapi_spec(), indent=2) + "\n", "utf-8")
        _err.print(f"wrote {write_openapi}")
        return
    if policy is None:
        raise CCPOError("--policy DIR is required (a folder written by `ccpo train`)")
    over = _overrides(**(settings or {}), prices=prices)
    renames = {f"server.{k}": flag for k, flag in _SERVER_FLAGS.items()}
    cfg = load_deploy_config(config, over, renames)
    check_port_free(cfg.server.host, cfg.server.port)
    traces_to = tracing.configure_from_env()  # OTEL_EXPORTER_OTLP_ENDPOINT: OpenTelemetry
    quiet_http_logs()
    service = printing_provenance(lambda: server.Service.from_artifact(policy, cfg))
    a = service.agent
    kappa = "greedy" if a.kappa is None else f"κ = {a.kappa:.4g}"
    _err.print(
        f"ccpo serve: {a.policy.variant} (T = {a.horizon}, α = {a.alpha:g}, {kappa}"
        f"{', adaptive' if cfg.server.adapt_kappa else ''}); {a.ladder.describe()}; "
        f"state {service.store.where}{' (restored)' if service.store.restored else ''}, "
        f"replica {service.store.replica}; auth "
        f"{'on' if service.token else 'off'}; http://{cfg.server.host}:{cfg.server.port}",
        highlight=False,
    )
    if traces_to:
        _err.print(f"ccpo serve: OpenTelemetry traces to {traces_to} (OTLP/HTTP)")
    server.run(service, log_level)


def register(app: typer.Typer) -> None:
    """Add ``ask``, ``replay-server``, ``dry-run`` and ``serve`` to ``app``."""
    app.command("ask")(ask_cmd)
    app.command("replay-server")(replay_server_cmd)
    app.command("dry-run")(dry_run_cmd)
    app.command("serve")(serve_cmd)
