"""Deployment settings: one pydantic model, loadable from YAML, overridable by arguments/flags.

A YAML config (``ccpo ask/serve --config FILE``) uses the field names below (``-`` or ``_``)::

    endpoints:                       # where each model of the policy's ladder is served
      llama3.1-8b: {url: http://gpu-box:8000/v1}
      gpt-4o:      {url: https://api.openai.com/v1, key_env: OPENAI_API_KEY}
      "*":         {url: http://127.0.0.1:9000/v1}   # every model not named above
    prices: [my-prices.json]         # merged over the bundled table and the artifact's prices
    max_cost_per_request: 0.01       # USD
    max_cost_total: 20.0             # USD over the life of the state file (serve) / agent
    server:
      state: serve-state.sqlite

The task and the ladder (which model answers in each round, how the guide's verdict is made)
come from the policy, so ``endpoints`` (plus prices, keys and rails) is a complete config;
``task:``, where given, must agree with the policy's. The older keys ``base_model``,
``base_url``, ``guide_model``, ``guide_url`` (and ``*_key_env``) stay as the shorthand for a
one-pair ladder: they name the endpoint of those models, and for a policy trained on the
paper's one-pair protocol they may swap in other models (with a warning).
      auth_token_env: CCPO_SERVE_TOKEN
      adapt_kappa: true
      rate_limit_per_minute: 600

API keys: prefer ``*_key_env``; ``*_api_key`` may hold a literal key in a config file. Keys and
the server's bearer token are never printed, logged or written to the state file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from ccpo.errors import CCPOError
from ccpo.llm.config import (
    CollectConfig,
    EndpointSettings,
    flag_label,
    invalid_setting,
    read_config_file,
)

DEFAULT_TOKEN_ENV = "CCPO_SERVE_TOKEN"
STATE_ENV = "CCPO_SERVE_STATE"


class ServerConfig(BaseModel):
    """Settings of ``ccpo serve`` only (the ``server:`` section of the YAML config)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field("127.0.0.1", description="interface to bind")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: any free port)")
    state: str | None = Field(
        default_factory=lambda: os.environ.get(STATE_ENV) or None,
        description="where the state lives (money, κ, counters, answer sets): a SQLite file, "
        "or postgresql://USER@HOST:PORT/DB shared by several replicas (password from "
        f"$PGPASSWORD or ~/.pgpass) [${STATE_ENV}; none: in memory]",
    )
    replica: str | None = Field(
        None, description="this replica's id in the state and /metrics [host-pid-random]"
    )
    reservation_expiry: float = Field(
        120.0,
        gt=0,
        description="seconds a replica's reservations outlive its last sign of life (a dead "
        "replica's calls then count as spent at their worst case); above the longest call",
    )
    state_timeout: float = Field(
        2.0,
        gt=0,
        description="seconds any operation on the state may take; longer, or while the "
        "database is away: 503 state_unavailable (no LLM call is made without a durable "
        "reservation)",
    )
    budget_wait: float = Field(
        15.0,
        gt=0,
        description="seconds a question may wait for room in max_cost_total (held by "
        "questions in flight, or by a replica that died, until its lease expires); then 503 "
        "budget_busy with Retry-After",
    )
    shutdown_grace: float = Field(
        10.0,
        ge=0,
        description="on SIGTERM, seconds in-flight questions may take to finish; then their "
        "calls are counted as spent at their worst case",
    )
    auth_token_env: str | None = Field(
        None, description=f"env var with the bearer token [{DEFAULT_TOKEN_ENV} when set]"
    )
    auth_token: SecretStr | None = Field(None, description="bearer token (config file only)")
    max_body_bytes: int = Field(65536, ge=256, description="largest request body accepted")
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a request head may take to arrive (from the connection, or from the "
        "first byte of the next request on a kept-alive one); slower: 408 and closed",
    )
    body_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a request body may take to arrive in full (from the end of its "
        "head); slower: 408 and closed",
    )
    keep_alive_timeout: float = Field(
        5.0, gt=0, description="seconds an idle kept-alive connection stays open"
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="connections open at once (more: 503 and closed at once); lowered, with a "
        "warning, to fit the open-file limit (ulimit -n)",
    )
    max_question_chars: int = Field(8000, ge=1, description="longest question accepted")
    max_conversation_chars: int = Field(
        32000,
        ge=1,
        description="longest conversation a chat policy accepts (characters of all its "
        "messages); longer: 422 before any LLM call",
    )
    rate_limit_per_minute: float | None = Field(
        None, gt=0, description="requests per minute per client address (None: no limit)"
    )
    rate_burst: int = Field(20, ge=1, description="requests a client may send at once")
    feedback_per_minute: float | None = Field(
        30,
        gt=0,
        description="feedbacks per minute per client address (None: no limit, only with the "
        "bearer token on)",
    )
    feedback_burst: int = Field(10, ge=1, description="feedbacks a client may send at once")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses of reverse proxies whose X-Forwarded-For is believed "
        "(none: the client address is the peer's)",
    )
    max_clients: int = Field(
        10_000, ge=1, description="client addresses the rate limiters remember (oldest go)"
    )
    adapt_kappa: bool = Field(False, description="update κ online from feedback")
    kappa_eta0: float | None = Field(
        None,
        gt=0,
        description="η_0 of the online κ tracker, per question [training η_0 / batch size]",
    )
    kappa_max_step: int | None = Field(
        200,
        ge=1,
        description="η_k stops decaying after this many feedbacks (tracks drift); None: never",
    )
    kappa_band: float = Field(
        0.1,
        ge=0,
        le=1,
        description="online κ stays within the calibration quantiles at levels α ± this "
        "(κ̂ ± this for policies without calibration scores); widen with care",
    )
    kappa_max_delta: float = Field(
        0.01,
        gt=0,
        le=1,
        description="largest step of the calibration level (of κ without calibration "
        "scores) per feedback (a bound on η: η ≤ this / max(α, 1 − α), so the fixed point "
        "stays at coverage 1 − α)",
    )
    kappa_min_feedback: int = Field(
        50, ge=0, description="feedbacks received before κ moves at all"
    )
    max_records: int = Field(100_000, ge=1, description="answer sets kept for feedback")

    @field_validator("state")
    @classmethod
    def _state(cls, v: str | None) -> str | None:
        from ccpo.runtime.state.backends import location_problem

        problem = None if v is None else location_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    def token(self) -> str | None:
        """The bearer token in force (config, else the env var), or None for no auth. Feedback
        without a rate limit needs one: anyone who can reach the server could flood it."""
        if self.auth_token is not None:
            val = self.auth_token.get_secret_value() or None
        else:
            env = self.auth_token_env or DEFAULT_TOKEN_ENV
            val = os.environ.get(env) or None
            if self.auth_token_env and not val:
                raise CCPOError(
                    f"server.auth_token_env names {env}, but that environment variable is not set"
                )
        if val is None and self.feedback_per_minute is None:
            raise CCPOError(
                "server.feedback_per_minute: null (feedback without a rate limit) needs the "
                f"bearer token: set ${DEFAULT_TOKEN_ENV} (or server.auth_token_env), or give a "
                "limit (feedbacks per minute per client address)"
            )
        return val


class DeployConfig(EndpointSettings):
    """Everything ``ConformalAgent`` / ``ccpo ask`` / ``ccpo serve`` need: the endpoints and
    round settings shared with collection (:class:`~ccpo.llm.config.EndpointSettings`), then
    the deployment's own."""

    task: str | None = Field(
        None, description="the policy's task (it knows it; where given, must agree)"
    )
    rounds: int | None = Field(None, ge=1, le=20, description="T (checked against the policy)")
    kappa: float | None = Field(None, ge=0, le=1, description="override the artifact's κ")
    concurrency: int = Field(16, ge=1, description="parallel requests per endpoint")
    timeout: float = Field(60.0, gt=0, description="seconds per LLM request")
    max_retries: int = Field(4, ge=0, description="retries per LLM request")
    cache: str | None = Field(None, description="SQLite response cache (None: no cache)")
    max_cost_per_request: float | None = Field(None, gt=0, description="USD cap per question")
    max_cost_total: float | None = Field(None, ge=0, description="USD cap over all questions")
    server: ServerConfig = Field(default_factory=ServerConfig, description="ccpo serve")
    reply_max_tokens: int | None = Field(
        None,
        ge=1,
        description="a chat ladder's cap on each reply's tokens (None: none, the model's own "
        "limit: the logged replies it was calibrated on were not cut)",
    )
    hedge_above: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="hedging (None: off): send the next round's guide at once, beside the "
        "first round, when a routed policy's chance of going on for the question is above "
        "this; cancelled (paid by its usage, or its worst case) when not needed",
    )
    route_embedding_timeout: float = Field(
        1.0,
        gt=0,
        description="seconds a routed policy waits for a question's embedding before it "
        "routes by the text alone",
    )

    @field_validator("task")
    @classmethod
    def _task(cls, v: str | None) -> str | None:
        return None if v is None else v.strip().lower() or None

    def collect_config(self, task: str, rounds: int, family: str | None = None) -> CollectConfig:
        """The collection settings of the same rounds (so they are run by the same code), for
        the policy's ``task``, ``family`` and T."""
        return CollectConfig(
            **self.endpoint_settings(),
            task=task,
            family=family,
            rounds=rounds,
            concurrency=self.concurrency,
            max_cost=self.max_cost_total,
            cache=self.cache,
            no_cache=self.cache is None,
            timeout=self.timeout,
            max_retries=self.max_retries,
        )


def _norm(d: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in d.items()}


def load_deploy_config(
    file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> DeployConfig:
    """Config file values, then every override that is not None (``server.*`` keys nest).

    A bad value is blamed on where it came from: the file (and key), or the override; with
    ``flags`` (the CLI's: override key → flag, for the flags not named ``--`` + the key) an
    override is named by its flag, else as a keyword argument (the Python API)."""
    values: dict[str, Any] = read_config_file(file) if file else {}
    server = _norm(dict(values.pop("server", None) or {}))
    given: dict[str, str] = {}
    for k, v in _norm(overrides or {}).items():
        if v is None or (isinstance(v, list | tuple) and not v):
            continue
        if k.startswith("server."):
            server[k.removeprefix("server.")] = v
        elif k == "server" and isinstance(v, dict):
            server.update(_norm(v))
            given.update({f"server.{s}": f"argument server['{s}']" for s in _norm(v)})
            continue
        else:
            values[k] = list(v) if isinstance(v, tuple) else v
        given[k] = flag_label(k, v, flags) if flags is not None else f"argument {k}"
    values["server"] = server
    try:
        return DeployConfig.model_validate(values)
    except ValidationError as e:
        raise CCPOError(invalid_setting(e, file, given, DeployConfig)) from None


def as_deploy_config(
    config: DeployConfig | str | Path | dict[str, Any] | None, overrides: dict[str, Any]
) -> DeployConfig:
    """A DeployConfig from an object, a YAML path or a dict, with overrides applied."""
    if isinstance(config, DeployConfig):
        if not overrides:
            return config
        dumped = config.model_dump(exclude_unset=True)
        dumped = _secret_values(config, dumped)
        return load_deploy_config(None, {**dumped, **overrides})
    if isinstance(config, dict):
        return load_deploy_config(None, {**config, **overrides})
    return load_deploy_config(config, overrides)


def _secret_values(cfg: DeployConfig, dumped: dict[str, Any]) -> dict[str, Any]:
    for k in ("base_api_key", "guide_api_key"):
        v = getattr(cfg, k)
        if v is not None:
            dumped[k] = v.get_secret_value()
    if cfg.server.auth_token is not None and "server" in dumped:
        dumped["server"]["auth_token"] = cfg.server.auth_token.get_secret_value()
    return dumped
