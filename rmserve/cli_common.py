"""Plumbing shared by every ``rmserve`` command.

* **Engine options, declared once.** Each field of
  :class:`~rmserve.server.config.EngineConfig` (except ``model``, the argument) is one command
  line option: its flag is the field name with dashes (``max_num_seqs`` → ``--max-num-seqs``),
  its type the field's type, its help the field's attribute docstring. :func:`engine_options`
  builds that table; :func:`with_engine_options` adds it to a command (``serve``, ``run``) and
  :func:`engine_argv` writes a mapping of option values back as ``rmserve serve`` arguments
  (what ``rmserve run`` starts). Adding an engine option is adding one ``EngineConfig`` field.
* **Help and messages, one style** (:class:`Command`, used by every command): plain text
  wrapped at the terminal width, options under their panel heading; help from docstrings
  loses its reST markup (:func:`plain_text`); a default is always written ``[default: X]``
  (:func:`field_help`, :func:`with_default`); ``--resamples``, ``--seed``, ``--quiet`` and
  ``--only`` have one help text everywhere; a bad value is reported against its option
  (:func:`bad_parameter`), without a validation library's prefix.
* **The admin token** (``--admin-token-file``, else ``$RMSERVE_ADMIN_TOKEN``).
* **One exit-code rule** for every command (:func:`exit_code`, :func:`guarded`):

  ===== ====================================================================================
  code  meaning
  ===== ====================================================================================
  0     success
  1     an rmserve error other than bad input: server unreachable or failed, fingerprint
        mismatch, a corrupt file the command itself keeps (``OUT/scores.jsonl``, the store)
  2     bad user input: an invalid option value, a model or option a server started by the
        command refused at start (``start_refused``), or bad data in a file the user named
        (benchmark data, score files given to ``metrics``)
  3     the run finished, but some groups could not be scored (recorded in the score file,
        counted as the official code counts them, named on stderr); ``--strict`` stops at
        the first such group with 1 instead. Also a judge's run from which not one verdict
        was read (its figures measure nothing)
  130   interrupted (Ctrl-C); what was scored so far is kept
  143   stopped by SIGTERM (after stopping what it started); what was scored so far is kept
  ===== ====================================================================================
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import enum
import functools
import inspect
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand

from rmserve.errors import DataError, RMServeError, StartRefused, plain_reason

T = TypeVar("T")

EXIT_OK = 0
"""Exit status of a command that did what it was asked."""
EXIT_ERROR = 1
"""Exit status of a command that failed for a reason other than its input."""
EXIT_BAD_INPUT = 2
"""Exit status of a command given an invalid option value or bad input data (also click's usage errors)."""
EXIT_UNSCORED = 3
"""A run that finished with groups that could not be scored."""

EXIT_INTERRUPTED = 130
"""Exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)."""
EXIT_TERMINATED = 143
"""Exit status of a command stopped by SIGTERM (128 + SIGTERM), after its cleanup ran."""


# --- attribute docstrings → help ------------------------------------------------------------


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass: field name → the string literal after the field, one line."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for field, doc in zip(body, body[1:]):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?(?P<target>[^`]+)`")
"""A Sphinx cross reference (``:mod:`x```, ``:class:`~a.B```)."""
_LITERAL = re.compile(r"``(?P<text>[^`]+)``|`(?P<single>[^`]+)`")
"""reStructuredText inline literals (double backticks) and interpreted text (single)."""
_NONE_MEANS = re.compile(r"(?:^|(?<=[.;] ))None = (?P<text>.+?)\.(?=\s|$)")
"""An attribute docstring's "None = X." clause: what an unset field means, up to the end of its sentence."""
_DEFAULT_SENTENCE = re.compile(r"(?:^|(?<=[.;] ))Default: (?P<text>.+?)\.(?=\s|$)")
"""A "Default: X." sentence of a docstring that names the default in words."""


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup, for the terminal.

    ``:role:`~a.b.C``` → ``C`` (the last part when the target starts with ``~``, else the
    target), ````x```` and ```x``` → ``x``. Everything else is kept.
    """

    def role(match: re.Match[str]) -> str:
        target = match.group("target")
        return target.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else target

    text = _ROLE.sub(role, text)
    return _LITERAL.sub(lambda m: m.group("text") or m.group("single"), text)


def with_default(text: str, default: str) -> str:
    """``text`` followed by ``[default: DEFAULT]``, the one way ``--help`` states a default
    (the form typer writes for the defaults it shows itself)."""
    return f"{text}  [default: {default}]" if text else f"[default: {default}]"


_SNAKE = re.compile(r"(?<![\w.$/-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w-])")
"""A snake_case word: how a config field is named in a docstring."""


def flags_for_fields(text: str, flags: Mapping[str, str]) -> str:
    """``text`` with each config field it names (a snake_case word among ``flags``) written
    as the flag that sets it (``fair_share`` → ``--fair-share``): help names what a user types."""
    return _SNAKE.sub(lambda m: flags.get(m.group(0), m.group(0)), text)


def field_help(cls: type, name: str, *, flag: str | None = None, flags: Mapping[str, str] | None = None) -> str:
    """Help text of a dataclass field: its attribute docstring as plain text, with its default.

    ``flags`` (field name → flag) turns the fields the docstring names into their flags
    (:func:`flags_for_fields`).

    The default is written ``[default: X]`` (:func:`with_default`). It comes from the
    docstring's "None = X." clause or "Default: X." sentence when it has one (both are taken
    out of the text: on the command line an option not given is the default, and ``None``
    cannot be typed), else from the field's default when that is not None. A boolean
    default is written as the flag that gives it (``--x`` or ``--no-x``; ``flag`` is the
    option, default ``--`` + the name with dashes).
    """
    text = plain_text(attribute_docs(cls).get(name, ""))
    if flags:
        text = flags_for_fields(text, flags)
    said: str | None = None
    for pattern in (_NONE_MEANS, _DEFAULT_SENTENCE):
        match = pattern.search(text)
        if match:
            said = match.group("text")
            before, after = text[: match.start()].rstrip(), text[match.end() :].lstrip()
            if before.endswith(";"):
                before = before[:-1] + "."
            text = f"{before} {after}".strip()
            break
    if said is None:
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        default = defaults.get(name, dataclasses.MISSING)
        if default is dataclasses.MISSING or default is None:
            return text
        if isinstance(default, bool):
            flag = flag or "--" + name.replace("_", "-")
            said = flag if default else f"--no-{flag[2:]}"
        else:
            said = str(default)
    return with_default(text, said)


# --- commands ------------------------------------------------------------------------------


HELP_NAME_COLUMN = 30
"""Widest option column in ``--help``; a longer option name gets its help on the next line."""


def table_lines(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    """A tab-separated table as lines: ``header`` first, then one line per row, in order."""
    return ["\t".join(line) for line in (header, *rows)]


def print_table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> None:
    """Print :func:`table_lines` of ``header`` and ``rows`` to stdout, one line each."""
    for line in table_lines(header, rows):
        typer.echo(line)


def write_rows(formatter: Any, rows: list[tuple[str, str]]) -> None:
    """Write (option, help) rows as a two-column list that wraps the help at the formatter's
    width. Lines break at spaces only, never inside a word or after a hyphen, so option
    names in the help (``--no-enforce-eager``) stay whole."""
    indent = formatter.current_indent
    name_width = min(max((len(name) for name, _ in rows), default=0), HELP_NAME_COLUMN) + 2
    text_width = max(formatter.width - indent - name_width, 20)
    for name, text in rows:
        lines = textwrap.wrap(text, text_width, break_on_hyphens=False, break_long_words=False) if text else []
        if not lines:
            formatter.write(f"{' ' * indent}{name}\n")
            continue
        if len(name) <= name_width - 2:
            formatter.write(f"{' ' * indent}{name.ljust(name_width)}{lines[0]}\n")
            lines = lines[1:]
        else:
            formatter.write(f"{' ' * indent}{name}\n")
        for line in lines:
            formatter.write(f"{' ' * (indent + name_width)}{line}\n")


_RUNNING: contextvars.ContextVar[Any] = contextvars.ContextVar("rmserve_running_command", default=None)
"""The click context of the :class:`Command` running now (None outside one)."""


@dataclasses.dataclass(frozen=True)
class DeprecatedFlag:
    """An old spelling of an option, still accepted: ``old`` is read as ``new`` (with one
    warning line on stderr) by the commands named in ``commands`` that have ``new``."""

    old: str
    new: str
    commands: tuple[str, ...]
    """Command names (``eval``, ``load`` …) where ``old`` meant ``new``."""


DEPRECATED_FLAGS: tuple[DeprecatedFlag, ...] = (
    DeprecatedFlag("--ready-timeout-s", "--wait-ready-s", ("eval",)),
    DeprecatedFlag("--startup-timeout-s", "--wait-ready-s", ("run",)),
    DeprecatedFlag("--server-wait-s", "--wait-ready-s", ("sweep",)),
    DeprecatedFlag("--timeout-s", "--wait-request-s", ("eval", "run", "sweep")),
    DeprecatedFlag("--timeout-s", "--wait-load-s", ("load",)),
    DeprecatedFlag("--load-timeout-s", "--wait-load-s", ("sweep",)),
    DeprecatedFlag("--max-retry-after-s", "--wait-retry-after-s", ("eval", "run", "sweep", "list", "load", "release")),
    DeprecatedFlag("--max-in-flight", "--max-inflight-groups", ("eval", "run", "sweep")),
    DeprecatedFlag("--url", "--server", ("list", "load", "release")),
    DeprecatedFlag("--swap-wait-s", "--wait-swap-s", ("serve",)),
    DeprecatedFlag("--swap-drain-timeout-s", "--wait-drain-s", ("serve",)),
    DeprecatedFlag("--kind", "--head", ("demo-model",)),
)
"""Old option spellings that keep working (hidden from ``--help``). Waits and timeouts are
named ``--wait-<what is waited for>-s``; a server is ``--server URL`` everywhere."""


def deprecation_line(old: str, new: str) -> str:
    """The one line printed (stderr) when a deprecated spelling is used."""
    return f"warning: {old} is deprecated; use {new}"


def _renamed(command: Any, args: list[str]) -> list[str]:
    """``args`` with the deprecated spellings of ``command``'s options replaced by the new
    flags (``--old V`` and ``--old=V``), one warning line each; nothing after ``--``."""
    flags = {opt for param in command.params if param.param_type_name == "option" for opt in param.opts}
    renames = {d.old: d.new for d in DEPRECATED_FLAGS if command.name in d.commands and d.new in flags}
    if not renames:
        return args
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        flag, eq, value = arg.partition("=")
        if flag in renames and flag not in flags:
            typer.echo(deprecation_line(flag, renames[flag]), err=True)
            arg = f"{renames[flag]}{eq}{value}"
        out.append(arg)
    return out


def commands_with_flag(root: Any, flag: str) -> list[str]:
    """The commands under ``root`` (a click group) that take option ``flag``, as typed after
    ``rmserve`` (``eval``, ``models load``), in the order ``--help`` lists them."""
    found: list[str] = []

    def walk(command: Any, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
            return
        if any(not getattr(param, "hidden", False) and (flag in param.opts or flag in getattr(param, "secondary_opts", ()))
               for param in command.params):
            found.append(" ".join(path))

    walk(root, [])
    return found


FOREIGN_FLAG_TIPS: Mapping[tuple[str, str], str] = {
    ("run", "eval"): "rmserve run starts a server of its own; to score on a running server use rmserve eval --server URL",
    ("eval", "serve"): (
        "rmserve eval talks to a running server, whose engine options are given to rmserve serve; "
        "rmserve run starts a server with them and evaluates in one command"
    ),
    ("sweep", "serve"): (
        "rmserve sweep loads each checkpoint into a running server, whose engine options are given to rmserve serve"
    ),
}
"""Why an option of another command does not belong here, by (this command, a command that has
the option): the two ways of scoring (a server started here, or one already running) are the
commonest mix-up."""


def foreign_flag_message(command_path: str, flag: str, owners: list[str]) -> str:
    """The error for ``flag`` given to ``command_path`` (``rmserve run``) that only ``owners``
    (other commands, as from :func:`commands_with_flag`) take: which commands take it and, for a
    known mix-up (:data:`FOREIGN_FLAG_TIPS`), why it does not belong here."""
    here = command_path.split(" ", 1)[1] if " " in command_path else command_path
    where = ", ".join(f"rmserve {name}" for name in owners)
    message = f"No such option: {flag} (it is an option of {where}, not of rmserve {here})"
    for owner in owners:
        tip = FOREIGN_FLAG_TIPS.get((here, owner))
        if tip:
            return f"{message}. {tip}."
    return f"{message}."


PLACEHOLDER_BY_TYPE = {"INT": "N", "INTEGER": "N"}
"""Placeholder of an option without its own metavar, by click type name (others must name one)."""


def _plain_placeholders(params: Iterable[Any]) -> None:
    """Placeholders that say what goes there: an argument is shown by its name alone (``FILE...``,
    no ``<list[Path]>``, no braces in the usage line), a choice option by its choices
    (``rm-bench|rewardbench2``), an integer option without a metavar as ``N``."""
    for param in params:
        if param.param_type_name == "argument":
            if not isinstance(param, PlainArgument) and isinstance(param, TyperArgument):
                param.__class__ = PlainArgument
            continue
        if param.param_type_name != "option" or param.metavar is not None or param.is_flag:
            continue
        choices = option_choices(param)
        if choices:
            param.metavar = "|".join(choices)
        elif _value_type_name(param) in PLACEHOLDER_BY_TYPE:
            param.metavar = PLACEHOLDER_BY_TYPE[_value_type_name(param)]


def option_choices(param: Any) -> tuple[str, ...] | None:
    """The values a choice option takes, as typed (None for any other parameter).

    Typer ≥ 0.29 describes a parameter's type in ``type_descriptor``; older typer in click's
    ``type`` (a ``click.Choice``)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        raw = desc.choices if desc.is_choice else None
    else:
        raw = getattr(getattr(param, "type", None), "choices", None)
    return tuple(str(getattr(c, "value", c)) for c in raw) if raw else None


def _value_type_name(param: Any) -> str:
    """``INT``, ``FLOAT``, ``STR``… for a parameter's value type (either typer generation)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        annotation = desc.annotation
        return getattr(annotation, "__name__", str(annotation)).upper()
    return str(getattr(getattr(param, "type", None), "name", "")).upper()


class PlainArgument(TyperArgument):
    """An argument shown by its metavar alone: ``FILE...`` in help, ``FILE...`` / ``[MODEL]`` in usage."""

    def display_type_rich(self, ctx: Any) -> str | None:  # noqa: D102 - typer's hook
        return None

    def _rich_display_name(self) -> str:
        name = self.display_name_raw
        return f"{name}..." if self.nargs != 1 else name

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return f"{name}..." if self.nargs != 1 else name


class Command(TyperCommand):
    """Every ``rmserve`` command: plain-text help in sections, plain error messages.

    * ``--help`` lists the options under their ``rich_help_panel`` heading ("Options" when
      none), after the arguments, in the plain layout that wraps at the terminal width
      (the CLI is built with ``rich_markup_mode=None``: rich's panels cut long option
      names and defaults at 80 columns).
    * A bad option value is reported without the prefix the validation library puts before
      a validator's message (:func:`rmserve.errors.plain_reason`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_placeholders(self.params)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Arguments, then one section per help panel, in the order the parameters come."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                heading = "Arguments"
            else:
                heading = getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(heading, []).append(record)
        for heading, records in sorted(sections.items(), key=lambda item: item[0] != "Arguments"):
            with formatter.section(heading):
                write_rows(formatter, records)

    def invoke(self, ctx: Any) -> Any:
        """Run the command with its context known to :func:`bad_parameter`."""
        token = _RUNNING.set(ctx)
        try:
            return super().invoke(ctx)
        finally:
            _RUNNING.reset(token)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """click's parsing of ``args`` with deprecated spellings renamed (:data:`DEPRECATED_FLAGS`);
        a bad parameter (:class:`typer.BadParameter`) loses the validation library's prefix."""
        try:
            return super().parse_args(ctx, _renamed(self, args))
        except typer.BadParameter as exc:
            exc.message = plain_reason(exc.message)
            raise
        except Exception as exc:
            # click's NoSuchOption, from the click typer carries (its own copy in typer ≥ 0.29)
            flag = getattr(exc, "option_name", None) if type(exc).__name__ == "NoSuchOption" else None
            owners = commands_with_flag(ctx.find_root().command, flag) if flag else []
            if owners:
                exc.message = foreign_flag_message(ctx.command_path, flag, owners)  # type: ignore[attr-defined]
                exc.possibilities = None  # type: ignore[attr-defined]
            raise


# --- engine options -------------------------------------------------------------------------


ENGINE_PANEL = "Engine options (the same in serve and run)"
"""Heading of the engine options in ``--help``."""


@dataclasses.dataclass(frozen=True)
class EngineOption:
    """One ``EngineConfig`` field as a command line option."""

    name: str
    """The ``EngineConfig`` field (a Python identifier, also the command's parameter name)."""
    flag: str
    """The option: ``--`` + the name with dashes. Booleans also get ``--no-`` + the same."""
    value_type: Any
    """The field's type without ``None`` (``int``, ``float``, ``str``, ``Path``, ``bool`` or a ``Literal``)."""
    help: str
    """The field's attribute docstring (with its default)."""
    metavar: str | None = None
    """What goes after the flag in ``--help`` (None for a switch or a ``Literal``: its choices)."""
    choices: tuple[str, ...] | None = None
    """The values a ``str`` field takes (:data:`ENGINE_CHOICES`), checked by the command line."""

    @property
    def is_switch(self) -> bool:
        """True for a boolean field (``--x/--no-x``)."""
        return self.value_type is bool

    def annotation(self) -> Any:
        """The typer parameter annotation: optional, default None = "not given" (the config default applies)."""
        names = f"{self.flag}/--no-{self.flag[2:]}" if self.is_switch else self.flag
        value_type = typing.Literal[self.choices] if self.choices else self.value_type  # type: ignore[valid-type]
        return Annotated[
            typing.Optional[value_type],  # noqa: UP007 - typer needs a typing-level optional here
            typer.Option(names, help=self.help, show_default=False, rich_help_panel=ENGINE_PANEL, metavar=self.metavar),
        ]

    def argv(self, value: object) -> list[str]:
        """This option with ``value`` as ``rmserve serve`` arguments ([] for None)."""
        if value is None:
            return []
        if self.is_switch:
            if not isinstance(value, bool):
                raise ValueError(f"{self.name}: {value!r} must be true or false")
            return [self.flag if value else f"--no-{self.flag[2:]}"]
        return [self.flag, str(value)]


def _without_none(hint: Any) -> Any:
    """``X | None`` → ``X``; anything else unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


ENGINE_METAVARS: dict[str, str] = {
    "head": "HEAD",  # its choices are listed in its help (the |-joined list passes 80 columns)
    "ref_model": "MODEL",
    "judge_url": "URL",
    "judge_model": "NAME",
    "judge_api_key_env": "VAR",
    "gpu_memory_utilization": "FRACTION",
    "kv_cache_memory_bytes": "BYTES",
    "chat_template": "FILE",
    "served_model_name": "NAME",
    "cpu_threads_bind": "CPUS",
    "label_weights": "WEIGHT[,WEIGHT...]",
}
"""Placeholder of each engine option that is not an integer (``N``), a switch or a choice."""

ENGINE_CHOICES: dict[str, tuple[str, ...]] = {"dtype": ("auto", "float32", "bfloat16", "float16")}
"""Engine options typed ``str`` that take one of a few values (``dtype``: :data:`rmserve.server.config.DTYPES`)."""


def config_flags() -> dict[str, str]:
    """Config field → the flag that sets it, for every engine option and every ``serve``
    option whose flag is not the field name with dashes (what :func:`flags_for_fields` writes)."""
    from rmserve.server.config import EngineConfig

    flags = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(EngineConfig) if f.name != "model"}
    return {**flags, **SERVE_FLAGS}


SERVE_FLAGS: dict[str, str] = {
    "host": "--host",
    "port": "--port",
    "max_body_bytes": "--max-body-bytes",
    "max_inflight_groups": "--max-inflight-groups",
    "swap_wait_s": "--wait-swap-s",
    "swap_drain_timeout_s": "--wait-drain-s",
    "result_cache_groups": "--result-cache-groups",
    "users_file": "--users-file",
    "insecure_no_auth": "--insecure-no-auth",
    "fair_share": "--fair-share",
    "engine_concurrency_groups": "--engine-concurrency-groups",
    "engine_window_tokens": "--engine-window-tokens",
    "fair_share_quantum_tokens": "--fair-share-quantum-tokens",
    "fair_share_interactive_boost": "--fair-share-interactive-boost",
    "lease_idle_s": "--lease-idle-s",
    "training_log": "--training-log",
    "training_log_rate": "--training-log-rate",
    "training_log_text": "--training-log-text",
}
"""``ServerConfig`` field → its ``rmserve serve`` flag."""


@functools.cache
def engine_options() -> tuple[EngineOption, ...]:
    """Every ``EngineConfig`` field but ``model``, in declaration order, as an option.

    Raises:
        TypeError: a field whose type the command line cannot carry (a declaration bug, found
            at import of the CLI and by the tests).
    """
    from rmserve.server.config import EngineConfig

    hints = typing.get_type_hints(EngineConfig)
    options = []
    for field in dataclasses.fields(EngineConfig):
        if field.name == "model":
            continue
        value_type = _without_none(hints[field.name])
        if not (value_type in (int, float, str, bool, Path) or typing.get_origin(value_type) is typing.Literal):
            raise TypeError(f"EngineConfig.{field.name}: type {value_type!r} has no command line form")
        is_literal = typing.get_origin(value_type) is typing.Literal
        choices = ENGINE_CHOICES.get(field.name)
        if field.name in ENGINE_METAVARS:  # a Literal's too, when its choices do not fit a line
            metavar = ENGINE_METAVARS[field.name]
        elif value_type in (bool,) or is_literal or choices:
            metavar = None
        elif value_type is int:
            metavar = "N"
        else:
            raise TypeError(f"EngineConfig.{field.name}: no placeholder in ENGINE_METAVARS for its {value_type!r} values")
        options.append(
            EngineOption(
                name=field.name,
                flag="--" + field.name.replace("_", "-"),
                value_type=value_type,
                help=field_help(EngineConfig, field.name, flags=config_flags()),
                metavar=metavar,
                choices=choices,
            )
        )
    return tuple(options)


def engine_argv(values: Mapping[str, object]) -> list[str]:
    """``rmserve serve`` arguments for the engine option ``values`` (field name → value; None = not given).

    Options come in declaration order, so equal mappings give equal command lines.

    Raises:
        ValueError: a name that is no engine option, or a non-boolean value of a switch.
    """
    by_name = {option.name: option for option in engine_options()}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise ValueError(f"engine options: {', '.join(map(repr, unknown))} not among {', '.join(by_name)}")
    return [arg for option in engine_options() if option.name in values for arg in option.argv(values[option.name])]


def engine_options_of(args: Sequence[str]) -> dict[str, object]:
    """The engine options among ``rmserve serve`` arguments ``args`` (field name → value, only
    those given, as :func:`with_engine_options` hands them to a command): the inverse of
    :func:`engine_argv`. Every other argument (``--users-file FILE``, a model) is skipped.

    Raises:
        ValueError: an engine option without its value or with one its type refuses (the
            command line's message, naming the option).
    """
    # click's own ClickException, or the copy newer typer releases bundle: BadParameter's base either way.
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    found: dict[str, object] = {}
    parser = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @parser.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @with_engine_options
    def parse(*, engine_options: dict[str, Any]) -> None:
        found.update(engine_options)

    try:
        typer.main.get_command(parser).main(args=list(args), prog_name="rmserve serve", standalone_mode=False)
    except usage_error as exc:
        raise ValueError(exc.format_message()) from None  # type: ignore[attr-defined]
    return found


def with_engine_options(command: Callable[..., T]) -> Callable[..., T]:
    """Give a typer command every engine option.

    ``command`` declares a parameter ``engine_options``; it receives a dict of the engine
    options the user gave (field name → value; options not given are left out, so
    ``EngineConfig`` defaults apply). The options appear in ``--help`` after the command's
    own parameters, with the same help text in every command that uses this.
    """
    signature = inspect.signature(command, eval_str=True)
    if "engine_options" not in signature.parameters:
        raise TypeError(f"{command.__name__} has no engine_options parameter")
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values() if p.name != "engine_options"]
    added = [
        inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=option.annotation())
        for option in engine_options()
    ]
    clash = {p.name for p in own} & {p.name for p in added}
    if clash:
        raise TypeError(f"{command.__name__}: parameters {sorted(clash)} clash with engine options")
    names = [option.name for option in engine_options()]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> T:
        given = {name: kwargs.pop(name) for name in names}
        return command(**kwargs, engine_options={k: v for k, v in given.items() if v is not None})

    del wrapper.__wrapped__  # typer must see the signature below, not the command's
    wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
    return wrapper


def with_option_group(placeholder: str, group: Mapping[str, tuple[Any, Any]]) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Give a typer command a group of options shared with other commands, in one place.

    ``group`` maps each parameter name to its ``(annotation, default)`` (the annotation an
    ``Annotated[..., typer.Option(...)]``). The command declares a keyword-only parameter
    ``placeholder``; typer sees the group's parameters at its position instead (so ``--help``
    lists them there, in ``group``'s order) and the command receives their values as one dict
    (name → value) under ``placeholder``.

    Raises:
        TypeError: the command has no ``placeholder`` parameter, or one of its own clashes
            with a name of the group.
    """

    def decorate(command: Callable[..., T]) -> Callable[..., T]:
        signature = inspect.signature(command, eval_str=True)
        if placeholder not in signature.parameters:
            raise TypeError(f"{command.__name__} has no {placeholder} parameter")
        clash = set(signature.parameters) & set(group)
        if clash:
            raise TypeError(f"{command.__name__}: parameters {sorted(clash)} clash with the {placeholder} options")
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != placeholder:
                params.append(param)
                continue
            params.extend(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                for name, (annotation, default) in group.items()
            )

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> T:
            values = {name: kwargs.pop(name) for name in group}
            return command(**kwargs, **{placeholder: values})

        del wrapper.__wrapped__  # typer must see the signature below, not the command's
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


MODEL_HELP_JUDGE_URL = (
    "May be left out with --kind judge --judge-url URL --judge-model NAME (a judge behind an "
    "OpenAI-compatible endpoint)."
)
"""Help of the MODEL argument of ``serve`` and ``run``."""


def model_argument(model: str | None, engine_options: Mapping[str, object]) -> str:
    """The model a ``serve`` / ``run`` command works on: MODEL, or ``--judge-model`` when MODEL
    is left out and ``--judge-url`` is given (the engine's ``model`` is then the endpoint's
    model name).

    Raises:
        typer.BadParameter: MODEL missing without ``--judge-url``, or with ``--judge-url`` but
            without ``--judge-model`` (names what to add).
    """
    if model is not None:
        return model
    if engine_options.get("judge_url") is None:
        raise typer.BadParameter(
            "MODEL is missing: give a model folder or hub id, or --model NAME=PATH per model on rmserve serve (it may be left out only with "
            "--kind judge --judge-url URL --judge-model NAME)",
            param_hint="'MODEL'",
        )
    judge_model = engine_options.get("judge_model")
    if not judge_model:
        raise typer.BadParameter(
            "MODEL is missing: with --judge-url and no MODEL, --judge-model NAME names the model at the endpoint",
            param_hint="'MODEL'",
        )
    return str(judge_model)


def check_model_sources(config: Any) -> None:
    """Before any engine starts (``rmserve serve``, and ``rmserve run`` before it starts one),
    tell each model path of an engine config (``model``, a DPO ``ref_model``) from a hub id
    and check a folder's files with the kind's rules and, for the model, its head settings
    (:func:`rmserve.server.swaps.checkpoints.check_model_source`) and that the engine serves
    its head (a ``remote-code`` head only on ``--engine hf``); a judge behind
    ``--judge-url`` names a model at the endpoint and is not checked here.

    Raises:
        ValueError: a path-like model that does not exist, a file, or a folder that breaks a
            rule; the message starts with the field (``model`` / ``ref_model``).
    """
    from rmserve.errors import ServerFault
    from rmserve.schema import CLASSIFIER_KIND
    from rmserve.server.config import check_reward_head
    from rmserve.server.swaps.checkpoints import check_model_source

    if getattr(config, "judge_url", None) is None:
        folder = check_model_source(config.model, config.kind, "model", getattr(config, "head_settings", None))
        if folder is not None and config.kind == CLASSIFIER_KIND:
            try:  # the head fits the folder (checked above); does the engine serve it?
                check_reward_head(str(folder), config.head_settings, config.engine)
            except ServerFault as exc:
                raise ValueError(f"model: {exc}") from None
    if getattr(config, "ref_model", None) is not None:
        check_model_source(config.ref_model, config.kind, "ref_model")


# --- admin token ----------------------------------------------------------------------------

ADMIN_TOKEN_ENV = "RMSERVE_ADMIN_TOKEN"
"""Environment variable holding the admin token when ``--admin-token-file`` is not given."""


def read_admin_token(token_file: Path | None) -> str | None:
    """The admin token: the file's stripped text, else ``$RMSERVE_ADMIN_TOKEN``, else None.

    Raises:
        ValueError: the file cannot be read or is empty.
    """
    if token_file is None:
        return os.environ.get(ADMIN_TOKEN_ENV) or None
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"--admin-token-file {str(token_file)!r} cannot be read: {exc.strerror}") from None
    if not token:
        raise ValueError(f"--admin-token-file {str(token_file)!r} is empty")
    return token


# --- exit codes -----------------------------------------------------------------------------


def exit_code(exc: BaseException, *, own_files: Iterable[Path | str | None] = ()) -> int:
    """The exit status of a command that raised ``exc`` (the table in this module's docstring).

    ``own_files`` are the files the command itself writes and reads back (its score file, the
    score store): bad data there is not the user's input, so it is 1, not 2.
    """
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (ValueError, typer.BadParameter, StartRefused)):
        return EXIT_BAD_INPUT
    if isinstance(exc, DataError):
        own = {Path(p).resolve() for p in own_files if p is not None}
        if exc.path is not None and Path(exc.path).resolve() in own:
            return EXIT_ERROR
        return EXIT_BAD_INPUT
    return EXIT_ERROR


@contextlib.contextmanager
def sigterm_exits() -> Iterator[Callable[[], bool]]:
    """While active (main thread, SIGTERM at its default), SIGTERM stops the program as Ctrl-C
    does: the SIGINT handler in force is called (an asyncio runner's cancels its main task and
    raises ``KeyboardInterrupt`` once the loop has unwound; the default one raises it where the
    program is), so the ``finally`` blocks run (a server started here is stopped, the score file
    closed) and no task is left holding an exception nobody reads. Yields a callable that says
    whether SIGTERM was received, so :func:`guarded` can tell it from Ctrl-C. Elsewhere, or under
    another SIGTERM handler, nothing changes (the callable says False)."""
    import signal
    import threading

    received: list[int] = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield lambda: False
        return

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint):
            on_sigint(signal.SIGINT, frame)
        else:  # SIGINT ignored or at SIG_DFL: still stop here
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield lambda: bool(received)
    finally:
        signal.signal(signal.SIGTERM, previous)


def error_line(exc: RMServeError, *, with_type: bool = True) -> str:
    """One line for stderr: ``error: TYPE: MESSAGE (field F)`` (the message's whitespace
    folded; the lines the error quotes, :attr:`~rmserve.errors.RMServeError.quoted`, are not
    part of it: :func:`error_lines`)."""
    message = " ".join(exc.message.split())
    field = f" (field {exc.field})" if exc.field and not isinstance(exc, DataError) else ""
    return f"error: {exc.type}: {message}{field}" if with_type else f"error: {message}"


def error_lines(exc: RMServeError, *, with_type: bool = True) -> list[str]:
    """What stderr gets for ``exc``: its :func:`error_line`, then each line it quotes (a server
    log's last lines: usage text, a traceback) as it was written, one per line."""
    return [error_line(exc, with_type=with_type), *exc.quoted]


def guarded(
    call: Callable[[], T],
    *,
    own_files: Iterable[Path | str | None] = (),
    input_option: str | None = None,
    kept: str | Callable[[], str | None] | None = None,
    resume_hint: Callable[[RMServeError], bool] = lambda exc: False,
    with_type: bool = True,
) -> T:
    """Run ``call``; an rmserve error or Ctrl-C ends the command with :func:`exit_code`'s status.

    Args:
        own_files: see :func:`exit_code`.
        input_option: the option naming the input data (``--data``); bad data there is
            reported as click reports a bad option value (usage line, then the message).
            None: one ``error:`` line, as for any other error.
        kept: where scored work is kept (``OUT/scores.jsonl``, the store), named when the
            command is interrupted and when ``resume_hint(exc)`` holds; a callable is asked
            when the error happens and returns None when nothing was kept (no resume hint).
        resume_hint: which errors get the "run the same command again to resume" line.
        with_type: whether the ``error:`` line names the error type.

    Raises:
        typer.Exit: with the status; typer.BadParameter: bad data under ``input_option``.
    """
    own = list(own_files)

    def kept_now() -> str | None:
        return kept() if callable(kept) else kept

    terminated: Callable[[], bool] = lambda: False
    try:
        with sigterm_exits() as terminated:
            return call()
    except KeyboardInterrupt:
        where_kept = kept_now()
        where = f"; scored groups are kept in {where_kept}; run again to resume" if where_kept else ""
        if terminated():
            typer.echo(f"terminated (SIGTERM){where}", err=True)
            raise typer.Exit(EXIT_TERMINATED) from None
        typer.echo(f"interrupted{where}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except RMServeError as exc:
        code = exit_code(exc, own_files=own)
        if code == EXIT_BAD_INPUT and isinstance(exc, DataError) and exc.field == "domains":
            # the loaders' selection argument is the commands' --only
            raise typer.BadParameter(exc.reason, param_hint="'--only'") from None
        if code == EXIT_BAD_INPUT and input_option is not None and isinstance(exc, DataError) and exc.path is not None:
            raise typer.BadParameter(str(exc), param_hint=f"'{input_option}'") from None
        for line in error_lines(exc, with_type=with_type):
            typer.echo(line, err=True)
        where_kept = kept_now()
        if where_kept and resume_hint(exc):
            typer.echo(f"scored groups are kept in {where_kept}; run the same command again to resume", err=True)
        raise typer.Exit(code) from None


def _blamed_option(message: str) -> tuple[str, str] | None:
    """(option, rest of the message) when ``message`` starts by naming an option of the
    running command, as its flag (``--bench 'x' is …``) or as its config field
    (``resamples must be …``, ``ServerConfig.port is …``), or an argument by its name
    (``model: …`` → ``MODEL``); None otherwise (or outside a command)."""
    ctx = _RUNNING.get()
    if ctx is None:
        return None
    head, sep, rest = message.partition(" ")
    head = head.rstrip(":")
    if re.fullmatch(r"[A-Z]\w*\.\w+", head):  # "ServerConfig.port is …": the field of a config
        head = head.split(".")[1]
    for param in ctx.command.params:
        if param.param_type_name == "argument":  # "model: …" blames MODEL
            shown = param.metavar or param.name.upper()
            if head in (param.name, shown.lower()) and sep:
                return shown, rest
            continue
        if param.param_type_name != "option" or not param.opts:
            continue
        flag = param.opts[0]
        if (head in (flag, param.name) or FIELD_PARAMS.get(head) == param.name) and sep:
            return flag, rest[len("is ") :] if rest.startswith("is ") else rest
    return None


FIELD_PARAMS: dict[str, str] = {
    "max_in_flight": "max_inflight_groups",
    "timeout_s": "wait_request_s",
    "ready_timeout_s": "wait_ready_s",
    "startup_timeout_s": "wait_ready_s",
    "server_wait_s": "wait_ready_s",
    "load_timeout_s": "wait_load_s",
    "max_retry_after_s": "wait_retry_after_s",
    "swap_wait_s": "wait_swap_s",
    "swap_drain_timeout_s": "wait_drain_s",
    "kind": "head",
}
"""Config field → the command parameter that sets it, where the two are named differently (a
message naming the field is reported against the option, :func:`bad_parameter`)."""


def bad_parameter(call: Callable[[], T]) -> T:
    """Run ``call`` (building a config); a ``ValueError`` becomes click's bad-parameter exit (2).

    A message that starts by naming an option of the command (its flag or its config field
    name) is reported against that option (``Invalid value for '--resamples': must be …``).
    """
    try:
        return call()
    except ValueError as exc:
        message = plain_reason(str(exc))
        blamed = _blamed_option(message)
        if blamed is None:
            raise typer.BadParameter(message) from None
        flag, rest = blamed
        raise typer.BadParameter(rest, param_hint=f"'{flag}'") from None


# --- options shared by eval, run and sweep -----------------------------------------------


class PriorityHint(str, enum.Enum):
    """Priority hints on the command line (header ``X-RMServe-Priority``)."""

    interactive = "interactive"
    batch = "batch"


PRIORITY_HELP = (
    "Priority hint sent with every request (header X-RMServe-Priority): the server's fair queue "
    "serves a user's interactive groups before its batch ones, and a server started with "
    "--scheduling-policy priority has vLLM run interactive requests first."
)
"""Help of ``--priority`` (``rmserve eval`` and ``rmserve sweep``; their defaults differ)."""


class Side(str, enum.Enum):
    """Truncation sides on the command line."""

    left = "left"
    right = "right"


TruncationOpt = Annotated[
    Optional[Side],
    typer.Option(
        "--truncation",
        help=with_default(
            "Cut sequences over --max-tokens from this side (left keeps the end, as RM-Bench's harness; right "
            "keeps the start, as RewardBench 2's). The cut is recorded per response and summarised. Without it, "
            "a sequence over the model's max length is not scored and its group is named at the end.",
            "no cut",
        ),
        show_default=False,
    ),
]
MaxTokensOpt = Annotated[
    Optional[int],
    typer.Option("--max-tokens", metavar="N",
                 help="Length each sequence is cut to, with --truncation (2 to the model's max length).",
                 show_default=False),
]
WaitRetryAfterOpt = Annotated[
    float,
    typer.Option("--wait-retry-after-s", metavar="SECONDS",
                 help="Longest wait taken from a server's Retry-After before a retry, seconds; a longer one is cut "
                 "to it, with a warning naming both."),
]
"""``--wait-retry-after-s`` of every command that talks to a server (default
:data:`rmserve.client.config.DEFAULT_MAX_RETRY_AFTER_S`, 60; write it ``60``, not ``60.0``)."""

ServerOpt = Annotated[
    str,
    typer.Option("--server", metavar="URL", help="Scoring server base URL, e.g. http://127.0.0.1:8000.",
                 show_default=False),
]
"""``--server URL`` of every command that talks to one running server."""

WaitRequestOpt = Annotated[
    float, typer.Option("--wait-request-s", metavar="SECONDS", help="Longest wait for the reply to one scoring request, seconds.")
]
"""``--wait-request-s`` of ``eval``, ``run`` and ``sweep``."""

WaitLoadOpt = Annotated[
    float, typer.Option("--wait-load-s", metavar="SECONDS", help="Longest wait for one checkpoint load, seconds.")
]
"""``--wait-load-s`` of ``sweep`` and ``models load``."""

WAIT_READY_HELP = "Longest wait for a server to be ready (its /health answering 200: the model loaded), seconds"
"""Help of ``--wait-ready-s`` on ``eval`` and ``sweep`` (no final period: each command adds to it)."""

WAIT_READY_WHY = (
    "600 by default for a running server; rmserve run waits 1800 by default, as it also starts the server and "
    "loads the model"
)
"""Why ``run``'s ``--wait-ready-s`` default differs from ``eval``'s and ``sweep``'s (said in all three)."""

STORE_WHY = (
    "rmserve eval and run keep their scores in OUT/scores.jsonl and use a store only when asked; rmserve sweep "
    "keeps its scores only in a store, so it always uses one"
)
"""Why ``sweep``'s ``--store`` default differs from ``eval``'s and ``run``'s (said in all three)."""

StrictOpt = Annotated[
    bool,
    typer.Option("--strict", help="Stop at the first group that cannot be scored (exit 1) instead of finishing "
                 "the run (exit 3 when groups were not scored)."),
]


def truncation_option(side: Side | None, max_tokens: int | None):
    """The :class:`~rmserve.schema.Truncation` of ``--truncation SIDE --max-tokens N`` (None when
    neither is given).

    Raises:
        typer.BadParameter: only one of the two is given, or ``max_tokens`` < 2.
    """
    from rmserve.schema import Truncation

    if side is None and max_tokens is None:
        return None
    if side is None or max_tokens is None:
        raise typer.BadParameter(
            "--truncation and --max-tokens go together (e.g. --truncation left --max-tokens 4096)",
            param_hint="'--truncation'" if side is None else "'--max-tokens'",
        )
    if max_tokens < 2:
        raise typer.BadParameter(f"must be at least 2 tokens, got {max_tokens}", param_hint="'--max-tokens'")
    return Truncation(side=side.value, max_tokens=max_tokens)


RESAMPLES_MAX = 1_000_000
"""Most bootstrap resamples any command accepts (:func:`rmserve.metrics.bootstrap.check_resampling`)."""


def resamples_help(least: int) -> str:
    """Help of ``--resamples``: one meaning in every command (the bootstrap resamples behind
    each interval), with the command's range: ``least`` 0 where intervals can be turned off,
    1 where the command reports paired differences, which need them."""
    why = "0 = no intervals" if least == 0 else "the paired differences need intervals"
    return f"Bootstrap resamples behind each interval ({least} to {RESAMPLES_MAX}; {why})."


SEED_HELP = "Bootstrap seed (≥ 0); the same seed and scores give the same intervals."
"""Help of ``--seed``, the same in every command."""

QUIET_HELP = "No progress bar or run summary on stderr."
"""Help of ``--quiet`` / ``-q``, the same in every command that scores."""


def only_help() -> str:
    """Help of ``--only`` (eval, run, sweep): what it selects and every valid name."""
    from rmserve.datasets import part_names_text

    return (
        "Score only this RM-Bench domain or RewardBench 2 subset, named as the tables name it "
        "(repeatable; any case; - for a space, as in precise-if; the other parts are reported as excluded). "
        f"RM-Bench: {part_names_text('rm-bench')}. "
        f"RewardBench 2: {part_names_text('rewardbench2')}."
    )


def only_option(benchmarks: Iterable[str], names: list[str] | None) -> dict[str, tuple[str, ...]] | None:
    """The parts ``--only NAME...`` selects per benchmark (None when not given).

    Raises:
        typer.BadParameter: a name no benchmark of the run has (with the valid names and the
            closest one) or a benchmark it selects nothing from, blamed on ``--only``.
    """
    if not names:
        return None
    from rmserve.datasets import select_parts

    try:
        return select_parts(list(benchmarks), names)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--only'") from None
