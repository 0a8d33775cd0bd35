"""Collection settings: one pydantic model, loadable from YAML, overridable by CLI flags.

- :class:`CollectConfig` (over :class:`EndpointSettings`): every setting of ``ccpo collect``;
  :class:`EndpointSpec`, :class:`PolicyLLMSpec`, :class:`LadderRoundSpec` its parts.
- :func:`build_config`: flags over a YAML file (:func:`read_config_file`; field names with
  ``-`` or ``_``) over defaults; :func:`invalid_setting` names the flag or the file's key of a
  bad value.

API keys: prefer ``*_key_env`` (the name of an environment variable). ``*_api_key`` may hold a
literal key in a config file; it is never printed, logged, cached or written to traces.
An example file: docs/cli.md, section "collect".
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ccpo.errors import CCPOError
from ccpo.llm.cache import ResponseCache
from ccpo.llm.client import (
    HTTP_BACKENDS,
    Endpoint,
    LLMClient,
    RetryPolicy,
    SpendLedger,
    redact_url,
)
from ccpo.traces.answers import family_of
from ccpo.traces.ladder import VERDICT_MODES, Ladder, LadderRound, Role, Step, default_prompt
from ccpo.traces.prices import PriceTable
from ccpo.traces.signals import normalize_signals


def default_cache_path() -> Path:
    """``$CCPO_CACHE_DIR/responses.sqlite``, else under ``$XDG_CACHE_HOME/ccpo`` or ``~/.cache``."""
    d = os.environ.get("CCPO_CACHE_DIR")
    if d:
        return Path(d) / "responses.sqlite"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ccpo" / "responses.sqlite"


class PolicyLLMSpec(BaseModel):
    """One LLM-as-policy model."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str
    url: str | None = None
    key_env: str | None = None
    api_key: SecretStr | None = None

    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.model,
            self.url,
            self.key_env,
            self.api_key.get_secret_value() if self.api_key else None,
        )


class EndpointSpec(BaseModel):
    """Where one model is served: ``endpoints: {MODEL: {url, key_env}}`` in a config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    url: str | None = Field(None, description="OpenAI-compatible URL (…/v1); none: OpenAI")
    key_env: str | None = Field(None, description="env var with the API key")
    api_key: SecretStr | None = Field(None, description="API key (config file only)")

    def endpoint(self, model: str) -> Endpoint:
        key = self.api_key.get_secret_value() if self.api_key else None
        return Endpoint(model, self.url, self.key_env, key)


class EndpointSettings(BaseModel):
    """The base and guide endpoints and how a round is run: the settings collection
    (:class:`CollectConfig`) and deployment (:class:`ccpo.runtime.config.DeployConfig`) share,
    declared once (so a deployed agent runs its rounds exactly as they were collected)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    base_model: str | None = Field(None, description="base model name (collect-exit: its model)")
    base_url: str | None = Field(None, description="base OpenAI-compatible URL (…/v1)")
    base_key_env: str | None = Field(None, description="env var with the base API key")
    base_api_key: SecretStr | None = Field(None, description="base API key (config file only)")
    guide_model: str | None = Field(None, description="guide model name")
    guide_url: str | None = Field(None, description="guide OpenAI-compatible URL (…/v1)")
    guide_key_env: str | None = Field(None, description="env var with the guide API key")
    guide_api_key: SecretStr | None = Field(None, description="guide API key (config only)")
    endpoints: dict[str, EndpointSpec] = Field(
        default_factory=dict,
        description="model name → {url, key_env} for every model of a ladder ('*': any other)",
    )
    prices: list[str] = Field(default_factory=list, description="price files over bundled")
    temperature_first: float = Field(0.0, ge=0, description="base temperature in round 1")
    temperature_later: float = Field(1.0, ge=0, description="base temperature in rounds >= 2")
    max_steps: int = Field(6, ge=1, description="ReAct steps per round (HotpotQA)")
    max_tokens: int = Field(512, ge=16, description="base max output tokens per CoT call")
    search: str = Field("auto", description="HotpotQA search: auto | context | bm25 | wikipedia")
    corpus: str | None = Field(None, description="JSONL {title,text} corpus for search=bm25")
    sample_offset: int = Field(0, ge=0, description="change to draw fresh samples")
    backoff_base: float = Field(0.5, ge=0, description="first backoff (s), doubled per retry")

    @field_validator("prices", mode="before")
    @classmethod
    def _prices(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("search")
    @classmethod
    def _search(cls, v: str) -> str:
        if v not in ("auto", "context", "bm25", "wikipedia"):
            raise ValueError("must be auto, context, bm25 or wikipedia")
        return v

    def base_endpoint(self) -> Endpoint:
        if not self.base_model:
            raise CCPOError("no base model: pass --base-model (or base_model in the config)")
        key = self.base_api_key.get_secret_value() if self.base_api_key else None
        return Endpoint(self.base_model, self.base_url, self.base_key_env, key)

    def guide_endpoint(self) -> Endpoint:
        if not self.guide_model:
            raise CCPOError("no guide model: pass --guide-model (or guide_model in the config)")
        key = self.guide_api_key.get_secret_value() if self.guide_api_key else None
        return Endpoint(self.guide_model, self.guide_url, self.guide_key_env, key)

    def endpoint_for(self, model: str) -> Endpoint:
        """The endpoint of ``model``: its ``endpoints`` entry, else the base/guide shorthand
        that names it, else the ``'*'`` entry; a clear error naming the model otherwise. A
        shorthand that only names the model (no URL, key or key variable of its own) does not
        hide the ``'*'`` entry: it would send the model to the OpenAI API instead."""
        if model in self.endpoints:
            return self.endpoints[model].endpoint(model)
        star = "*" in self.endpoints
        if model == self.base_model and (
            not star or self.base_url or self.base_key_env or self.base_api_key
        ):
            return self.base_endpoint()
        if model == self.guide_model and (
            not star or self.guide_url or self.guide_key_env or self.guide_api_key
        ):
            return self.guide_endpoint()
        if "*" in self.endpoints:
            return self.endpoints["*"].endpoint(model)
        raise CCPOError(
            f"model '{model}' has no endpoint: add it under endpoints: in the config (e.g. "
            f"'{model}: {{url: http://host:8000/v1}}'), or a '*' entry for every model"
        )

    def endpoint_settings(self) -> dict[str, Any]:
        """These settings' values (secrets kept as they are), to build another config."""
        return {k: getattr(self, k) for k in EndpointSettings.model_fields}


class LadderRoundSpec(BaseModel):
    """One round of a ``ladder:`` in a collect config: ``{base: MODEL, guide: MODEL, verdict:
    judge|agree|verify}`` (a verify step's base is the one-model step before it, its guide
    the verifier; a step may be ``{model, prompt}``, and in the chat family ``{model,
    system}``: a system prompt of its own, sent in front of the conversation)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    base: str | dict[str, str]
    guide: str | dict[str, str]
    verdict: str = Field("judge", description="judge | agree | verify")

    @field_validator("verdict")
    @classmethod
    def _verdict(cls, v: str) -> str:
        if v not in VERDICT_MODES:
            raise ValueError("must be judge, agree or verify")
        return v

    def ladder_round(self, task: str, family: str | None = None) -> LadderRound:
        def step(v: str | dict[str, str], role: Role) -> Step:
            prompt = default_prompt(task, role, self.verdict, family)
            if isinstance(v, str):
                return Step(v, prompt)
            if "model" not in v:
                raise CCPOError(f"ladder: a {role} step needs a model")
            unknown = set(v) - {"model", "prompt", "system"}
            if unknown:
                raise CCPOError(f"ladder: a {role} step has no setting {sorted(unknown)[0]!r}")
            return Step(v["model"], v.get("prompt") or prompt, v.get("system") or None)

        return LadderRound(step(self.base, "base"), step(self.guide, "guide"), self.verdict)


class CollectConfig(EndpointSettings):
    """Everything ``ccpo collect`` / ``collect-exit`` needs (one line of doc per field)."""

    task: str = Field(description="mmlu | hotpotqa | jsonl, or a name of yours with --data")
    family: str | None = Field(
        None,
        description="answer family of a task that is not built in: mcq | short | exact | number "
        "| chat (chat: the question is a conversation, replies compared verbatim)",
    )
    ladder: list[LadderRoundSpec] | None = Field(
        None,
        description="one entry per round {base, guide, verdict: judge|agree|verify} (default: the "
        "base/guide pair in every round, judged)",
    )
    signals: list[str] | None = Field(
        None,
        description="signals the ladder records and its policies see: similarity, embedding, "
        "length, refusal, logprob, verdict (docs/design.md, Signals)",
    )
    embedding_model: str | None = Field(
        None, description="model of the 'embedding' signal, served at /embeddings (endpoints)"
    )
    embedding_timeout: float = Field(
        10.0, gt=0, description="seconds an embeddings call may take before lexical fallback"
    )
    data: str | None = Field(None, description="question file/folder; default: bundled subset")
    n: int | None = Field(None, ge=1, description="use only the first N questions")
    shuffle_seed: int | None = Field(None, description="shuffle questions with this seed first")
    rounds: int = Field(4, ge=1, le=20, description="T: rounds run per question")
    policy_llm: list[PolicyLLMSpec] = Field(
        default_factory=list, description="LLM-as-policy models"
    )
    coverage: float = Field(0.9, gt=0, lt=1, description="1-alpha shown to the policy LLM")
    reference: str | None = Field(
        None,
        description="label by agreement with this model: it answers every question (chain of "
        "thought, T = 0; reused when the ladder already asked it so) and a step is correct iff "
        "its answer equals the reference's (task normaliser); questions need no gold, and "
        "gold, if any, is not used; needs an endpoint and a price",
    )
    concurrency: int = Field(8, ge=1, description="parallel questions / requests per endpoint")
    workers: int = Field(
        1, ge=1, le=64, description="client processes sharing the concurrency (fast endpoints)"
    )
    max_cost: float | None = Field(None, ge=0, description="USD budget of the run (never passed)")
    cache: str | None = Field(None, description="SQLite cache path; default user cache dir")
    no_cache: bool = Field(False, description="disable the response cache")
    out: str | None = Field(None, description="output .jsonl (append-only, resumable)")
    timeout: float = Field(120.0, gt=0, description="seconds per request")
    max_retries: int = Field(8, ge=0, description="retries per request")
    http_backend: str = Field("auto", description="HTTP transport: auto | aiohttp | httpx")
    stop_at_exit: bool = Field(False, description="LLM-EXIT: stop a question at [EXIT]")

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        v = v.strip().lower()
        if not v:
            raise ValueError("must name a task (mmlu, hotpotqa, jsonl or your own)")
        return v

    @model_validator(mode="after")
    def _family_and_ladder(self) -> CollectConfig:
        family_of(self.task, self.family)  # a ValueError names a bad family
        if self.signals is not None:
            try:
                self.signals = list(normalize_signals(self.signals, self.embedding_model))
            except CCPOError as e:
                raise ValueError(str(e).removeprefix("signals: ")) from None
        if self.ladder is not None:
            if not self.ladder:
                raise ValueError("ladder: needs at least one round")
            if "rounds" in self.model_fields_set and self.rounds != len(self.ladder):
                raise ValueError(f"rounds {self.rounds} but the ladder has {len(self.ladder)}")
            self.rounds = len(self.ladder)
        return self

    def make_ladder(self) -> Ladder:
        """The ladder this config runs: its ``ladder:`` rounds, else the base/guide pair in
        every round with the paper's judge (:meth:`Ladder.one_pair`), with its signals."""
        return dataclasses.replace(
            self._rounds_ladder(),
            signals=tuple(self.signals or ()),
            embedding_model=self.embedding_model,
        )

    def _rounds_ladder(self) -> Ladder:
        if self.ladder is None:
            return Ladder.one_pair(
                self.task,
                self.base_endpoint().model,
                self.guide_endpoint().model,
                self.rounds,
                self.family,
            )
        return Ladder(
            self.task,
            family_of(self.task, self.family),
            tuple(s.ladder_round(self.task, self.family) for s in self.ladder),
        )

    def exit_ladder(self) -> Ladder:
        """LLM-EXIT's: the one model in both roles (its guide step is never called)."""
        m = self.base_endpoint().model
        return Ladder.one_pair(self.task, m, m, self.rounds, self.family)

    @field_validator("http_backend")
    @classmethod
    def _http_backend(cls, v: str) -> str:
        if v not in HTTP_BACKENDS:
            raise ValueError(f"must be one of {', '.join(HTTP_BACKENDS)}")
        return v

    # -------------------------------------------------------------- derived
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_retries, backoff_base=self.backoff_base, timeout=self.timeout
        )

    def client(
        self,
        cache: ResponseCache,
        prices: PriceTable,
        budget: float | None,
        ledger: SpendLedger | None = None,
    ) -> LLMClient:
        """The LLM client of a run with these settings: ``budget`` USD at most (None: no cap),
        spending counted in ``ledger`` (None: a fresh one)."""
        return LLMClient(
            cache,
            prices,
            self.concurrency,
            self.retry_policy(),
            budget,
            http_backend=self.http_backend,
            ledger=ledger,
        )

    def cache_path(self) -> Path | None:
        if self.no_cache:
            return None
        return Path(self.cache) if self.cache else default_cache_path()

    def temperature(self, round_: int) -> float:
        return self.temperature_first if round_ == 1 else self.temperature_later


def _norm_keys(d: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in d.items()}


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML parser's error as one line: where (line, column: 1-based) and what, without the
    parser's excerpt of the file."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(str(getattr(e, "problem", None) or e).split())
    context, at = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and at is not None:
        what += f" ({context} from line {at.line + 1})"
    return f"{where}not valid YAML: {what}"


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: config file not found")
    try:
        obj = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise CCPOError(
            f"{p}, {yaml_problem(e)}; check the indentation, colons, quotes and brackets there"
        ) from None
    except UnicodeDecodeError:
        raise CCPOError(f"{p}: not UTF-8 text (save the config file as UTF-8)") from None
    if not isinstance(obj, dict):
        raise CCPOError(f"{p}: expected a mapping of settings")
    return _norm_keys(obj)


def flag_name(key: str, renames: Mapping[str, str] | None = None) -> str:
    """The command-line flag that sets ``key`` (``max_cost`` → ``--max-cost``, ``server.port``
    → ``--port``), unless ``renames`` names it otherwise."""
    if renames and key in renames:
        return renames[key]
    return "--" + key.rsplit(".", 1)[-1].replace("_", "-")


def flag_label(key: str, value: Any, renames: Mapping[str, str] | None = None) -> str:
    """How an error names a value given by flag: ``--concurrency 0`` (the flag alone for a
    list; a URL's password as ``***``)."""
    flag = flag_name(key, renames)
    if isinstance(value, str):
        value = redact_url(value)
    return f"{flag} {value}" if isinstance(value, str | int | float) else flag


def _fields_at(model: Any, loc: Sequence[Any]) -> list[str]:
    """The setting names of the (nested) pydantic model at ``loc`` (a validation error's
    location: field names, dict keys, list indices) under ``model``; empty when it is not a
    model."""

    def members(t: Any) -> list[Any]:  # X | Y | None → X, Y
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            return [m for a in typing.get_args(t) if a is not type(None) for m in members(a)]
        return [t]

    def inside(t: Any, part: Any) -> list[Any]:
        if isinstance(t, type) and issubclass(t, BaseModel):
            return [t.model_fields[part].annotation] if part in t.model_fields else []
        args = typing.get_args(t)
        if typing.get_origin(t) is dict and len(args) == 2:
            return [args[1]]
        if typing.get_origin(t) in (list, tuple, set, frozenset) and args:
            return [args[0]]
        return []

    kinds = members(model)
    for part in loc:
        kinds = [m for t in kinds for inner in inside(t, part) for m in members(inner)]
    return sorted(
        {f for t in kinds if isinstance(t, type) and issubclass(t, BaseModel)
         for f in t.model_fields}
    )  # fmt: skip


def _given_by(loc: Sequence[Any], given: Mapping[str, str]) -> str | None:
    """The flag (or argument) of ``given`` that set the value at ``loc``, if one did."""
    parts = [str(x) for x in loc]
    for n in range(len(parts), 0, -1):
        label = given.get(".".join(parts[:n]))
        if label is not None:
            return label
    return None


def _unknown_keys(
    e: ValidationError, model: Any, file: str | Path | None, given: Mapping[str, str]
) -> str | None:
    """Every mistyped key of ``e`` in one line, each with a "did you mean" where a setting of
    that place is close (difflib); None when ``e`` has no unknown key."""
    found, origin = [], None
    for err in e.errors():
        if err["type"] != "extra_forbidden":
            continue
        *where, key = [str(x) for x in err["loc"]]
        close = difflib.get_close_matches(key, _fields_at(model, err["loc"][:-1]), n=1)
        hint = f" (did you mean '{'.'.join([*where, close[0]])}'?)" if close else ""
        found.append(f"'{'.'.join([*where, key])}'{hint}")
        if origin is None:
            label = _given_by(err["loc"], given)
            origin = f"{label}: " if label else f"{file}: " if file else ""
    if not found:
        return None
    what = "unknown setting" if len(found) == 1 else "unknown settings"
    return f"{origin}{what} {', '.join(found)}"


def invalid_setting(
    e: ValidationError,
    file: str | Path | None,
    given: Mapping[str, str],
    model: Any = None,
) -> str:
    """One line for ``e``, blamed on where the value came from: the flag (or argument) of
    ``given`` (setting key → how to name it) that set it, else the config ``file`` and its
    key. Mistyped keys come first, all of them, each with a "did you mean" among the
    settings of ``model`` (the pydantic model validated) at that place."""
    unknown = _unknown_keys(e, model, file, given) if model is not None else None
    others = [err for err in e.errors() if unknown is None or err["type"] != "extra_forbidden"]
    if not others:
        return str(unknown)
    first = others[0]
    msg = first["msg"].removeprefix("Value error, ")
    label = _given_by(first["loc"], given)
    if label is not None:
        line = f"{label}: {msg}"
    else:
        origin = f"{file}: " if file and unknown is None else ""
        line = f"{origin}setting '{'.'.join(str(x) for x in first['loc'])}': {msg}"
    return line if unknown is None else f"{unknown}; {line}"


def build_config(
    file: str | Path | None, overrides: dict[str, Any], renames: Mapping[str, str] | None = None
) -> CollectConfig:
    """Config file values, then every CLI override that is not None. A bad value is blamed on
    its flag (``--`` + the key, or as ``renames`` says) or on the file, whichever gave it."""
    values: dict[str, Any] = read_config_file(file) if file else {}
    if isinstance(values.get("prices"), str):
        values["prices"] = [values["prices"]]
    given: dict[str, str] = {}
    for k, v in _norm_keys(overrides).items():
        if v is None or (isinstance(v, list | tuple) and not v and k in values):
            continue
        values[k] = list(v) if isinstance(v, tuple) else v
        given[k] = flag_label(k, v, renames)
    if "task" not in values:
        raise CCPOError("no task: pass --task mmlu|hotpotqa|jsonl (or task in the config)")
    try:
        return CollectConfig.model_validate(values)
    except ValidationError as e:
        raise CCPOError(invalid_setting(e, file, given, CollectConfig)) from None
