"""The config is the CLI (as in CleanRL): command options derived from the typed configs.

Two kinds of config, one idea: the training configs are dataclasses (:func:`config_options`,
below), the collection and deployment settings pydantic models (:func:`settings_options`).

Every field of a config dataclass (:class:`ccpo.learning.config.TrainConfig`,
:class:`ccpo.learning.config.StopConfig`) becomes an option of the command, with the field's
type, its default, and the help the field declares (:func:`ccpo.fields.knob`: the one place it
is documented). A command decorated with :func:`config_options` receives the
values as ``config={ConfigClass: {field: value}}`` and builds the configs itself
(:func:`build_config` turns a config's own validation error into a usage error).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import re
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

import typer
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ccpo.errors import CCPOError

C = TypeVar("C")
#: ``name: type = default  # help`` (one field line of a dataclass)


#: reStructuredText roles and literals (``:mod:`x` ``, ````x````) written in the fields' help
_RST = re.compile(r":[a-z]+:`~?([^`]+)`|``([^`]+)``")


def plain(text: str) -> str:
    """Help text as a terminal shows it: ``:mod:`ccpo.x` `` → ``ccpo.x``, ````x```` → ``x``."""
    return _RST.sub(lambda m: m.group(1) or m.group(2), text)


def config_help(cls: type) -> dict[str, str]:
    """Field name → help, as each field declares it (:func:`ccpo.fields.knob`)."""
    return {f.name: plain(f.metadata.get("help", "")) for f in dataclasses.fields(cls)}


def _checker(cls: type, name: str) -> Callable[[Any], Any]:
    """An option callback: the config's own validation of this one field (the others at their
    defaults), so a bad value is a usage error naming the option (exit code 2)."""

    def check(value: Any) -> Any:
        value = value.value if isinstance(value, enum.Enum) else value
        try:
            cls(**{name: value})
        except (ValueError, TypeError) as e:
            raise typer.BadParameter(str(e)) from None
        return value

    return check


def _option(
    cls: type, name: str, kind: Any, default: Any, help: str, panel: str
) -> inspect.Parameter:
    if typing.get_origin(kind) is Literal:  # choices: an Enum, which every typer takes
        values = [str(v) for v in typing.get_args(kind)]
        kind = enum.Enum(name, {v: v for v in values}, type=str)
        default = kind(default)
    extra: dict[str, Any] = {"callback": _checker(cls, name)}
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        flag = f"{flag}/--no-{name.replace('_', '-')}"
    opt = typer.Option(flag, help=help, rich_help_panel=panel, **extra)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, opt]
    )


def config_options(
    *groups: tuple[type, Collection[str], str],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a typer command with one option per field of each config in ``groups``:
    (config class, fields left out, help panel title). A field already taken by the command's
    own parameters or by an earlier group is left out too. The command gets ``config``: config
    class → {field: value} of every derived option."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "config"]
        taken = {p.name for p in own}
        owner: dict[str, type] = {}
        extra: list[inspect.Parameter] = []
        for cls, skip, panel in groups:
            hints, helps = typing.get_type_hints(cls), config_help(cls)
            for f in dataclasses.fields(cls):
                if f.name in skip or f.name in taken or f.default is dataclasses.MISSING:
                    continue
                help_text = helps.get(f.name, "")
                extra.append(_option(cls, f.name, hints[f.name], f.default, help_text, panel))
                taken.add(f.name)
                owner[f.name] = cls

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            config: dict[type, dict[str, Any]] = {cls: {} for cls, _, _ in groups}
            for name, cls in owner.items():
                config[cls][name] = kwargs.pop(name)
            return func(**kwargs, config=config)

        command.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        return command

    return deco


def build_config(cls: type[C], values: dict[str, Any]) -> C:
    """``cls(**values)``; a value the config refuses is a usage error naming the option."""
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        raise CCPOError(f"bad option value: {e}") from None


def _scalar(annotation: Any) -> Any:
    """``X | None`` → ``X`` (the option's type; None is its 'not given')."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 else annotation


def _default_note(default: Any) -> str:
    if default is None or default is False or default is PydanticUndefined:
        return ""
    return f" [{default:g}]" if isinstance(default, float) else f" [{default}]"


#: what a structured option looks like on the command line, for its help
_STRUCTURED_EXAMPLES = {"endpoints": """'{"*": {url: http://127.0.0.1:9000/v1}}'"""}


def _is_structured(kind: Any) -> bool:
    """A setting that is a mapping, a list or a model (not a flag's scalar)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return True
    return typing.get_origin(kind) in (dict, list, tuple)


def _parse_structured(flag: str, text: str) -> Any:
    """A structured option's value: YAML (JSON is YAML too); a usage error naming the flag."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        first = " ".join(str(e).split())
        raise CCPOError(f"{flag}: not YAML or JSON ({first})") from None


def settings_options(
    model: type[BaseModel],
    fields: Sequence[str],
    flags: Mapping[str, str] | None = None,
    panel: str | None = None,
    prefix: str = "",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a typer command with one option per field of a pydantic settings ``model``
    (:class:`~ccpo.llm.config.CollectConfig`, :class:`~ccpo.runtime.config.DeployConfig`, and
    the endpoint settings they share): the flag is ``--`` + the field (or as ``flags`` says),
    the help is the field's description and its default. Every option defaults to None, so a
    value not given on the command line leaves the config file's (or the model's default) in
    force. The command gets ``settings``: ``prefix`` + field → value given (or None), merged
    over the ``settings`` of another such decorator (a nested section: ``prefix="server."``);
    the settings loader validates them and blames a bad value on its flag."""
    flags = flags or {}

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "settings"]
        extra: list[inspect.Parameter] = []
        structured: set[str] = set()
        for name in fields:
            info = model.model_fields[name]
            flag = flags.get(name, "--" + name.replace("_", "-"))
            help_text = plain(info.description or "") + _default_note(info.default)
            kind = _scalar(info.annotation)
            extra_opt: dict[str, Any] = {}
            if _is_structured(kind):  # a mapping or list of settings: given as YAML / JSON
                structured.add(name)
                kind, extra_opt["metavar"] = str, "YAML"
                help_text += f" (YAML or JSON: {_STRUCTURED_EXAMPLES.get(name, 'as in --config')})"
            opt = typer.Option(
                flag, help=help_text, rich_help_panel=panel, show_default=False, **extra_opt
            )
            extra.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None,
                    annotation=Annotated[kind | None, opt],
                )
            )

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            settings = dict(kwargs.pop("settings", None) or {})
            for name in fields:
                value = kwargs.pop(name)
                if name in structured and value is not None:
                    value = _parse_structured(flags.get(name, "--" + name.replace("_", "-")), value)
                settings[prefix + name] = value
            return func(**kwargs, settings=settings)

        command.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        return command

    return deco
