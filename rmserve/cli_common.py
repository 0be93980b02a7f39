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
  2     bad user input: an invalid option value, or bad data in a file the user named
        (benchmark data, score files given to ``metrics``)
  3     the run finished, but some groups could not be scored (recorded in the score file,
        counted as the official code counts them, named on stderr); ``--strict`` stops at
        the first such group with 1 instead
  130   interrupted (Ctrl-C); what was scored so far is kept
  ===== ====================================================================================
"""

from __future__ import annotations

import ast
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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from typer.core import TyperCommand

from rmserve.errors import DataError, RMServeError, plain_reason

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


def field_help(cls: type, name: str, *, flag: str | None = None) -> str:
    """Help text of a dataclass field: its attribute docstring as plain text, with its default.

    The default is written ``[default: X]`` (:func:`with_default`). It comes from the
    docstring's "None = X." clause or "Default: X." sentence when it has one (both are taken
    out of the text: on the command line an option not given is the default, and ``None``
    cannot be typed), else from the field's default when that is not None. A boolean
    default is written as the flag that gives it (``--x`` or ``--no-x``; ``flag`` is the
    option, default ``--`` + the name with dashes).
    """
    text = plain_text(attribute_docs(cls).get(name, ""))
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


class Command(TyperCommand):
    """Every ``rmserve`` command: plain-text help in sections, plain error messages.

    * ``--help`` lists the options under their ``rich_help_panel`` heading ("Options" when
      none), after the arguments, in the plain layout that wraps at the terminal width
      (the CLI is built with ``rich_markup_mode=None``: rich's panels cut long option
      names and defaults at 80 columns).
    * A bad option value is reported without the prefix the validation library puts before
      a validator's message (:func:`rmserve.errors.plain_reason`).
    """

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
        """click's parsing; a bad parameter (:class:`typer.BadParameter`) loses the validation library's prefix."""
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as exc:
            exc.message = plain_reason(exc.message)
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

    @property
    def is_switch(self) -> bool:
        """True for a boolean field (``--x/--no-x``)."""
        return self.value_type is bool

    def annotation(self) -> Any:
        """The typer parameter annotation: optional, default None = "not given" (the config default applies)."""
        names = f"{self.flag}/--no-{self.flag[2:]}" if self.is_switch else self.flag
        return Annotated[
            typing.Optional[self.value_type],  # noqa: UP007 - typer needs a typing-level optional here
            typer.Option(names, help=self.help, show_default=False, rich_help_panel=ENGINE_PANEL),
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
        options.append(
            EngineOption(
                name=field.name,
                flag="--" + field.name.replace("_", "-"),
                value_type=value_type,
                help=field_help(EngineConfig, field.name),
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
    if isinstance(exc, (ValueError, typer.BadParameter)):
        return EXIT_BAD_INPUT
    if isinstance(exc, DataError):
        own = {Path(p).resolve() for p in own_files if p is not None}
        if exc.path is not None and Path(exc.path).resolve() in own:
            return EXIT_ERROR
        return EXIT_BAD_INPUT
    return EXIT_ERROR


def error_line(exc: RMServeError, *, with_type: bool = True) -> str:
    """One line for stderr: ``error: TYPE: MESSAGE (field F)`` (whitespace folded)."""
    message = " ".join(str(exc).split())
    field = f" (field {exc.field})" if exc.field and not isinstance(exc, DataError) else ""
    return f"error: {exc.type}: {message}{field}" if with_type else f"error: {message}"


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

    try:
        return call()
    except KeyboardInterrupt:
        where_kept = kept_now()
        where = f"; scored groups are kept in {where_kept}; run again to resume" if where_kept else ""
        typer.echo(f"interrupted{where}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except RMServeError as exc:
        code = exit_code(exc, own_files=own)
        if code == EXIT_BAD_INPUT and isinstance(exc, DataError) and exc.field == "domains":
            # the loaders' selection argument is the commands' --only
            raise typer.BadParameter(exc.reason, param_hint="'--only'") from None
        if code == EXIT_BAD_INPUT and input_option is not None and isinstance(exc, DataError) and exc.path is not None:
            raise typer.BadParameter(str(exc), param_hint=f"'{input_option}'") from None
        typer.echo(error_line(exc, with_type=with_type), err=True)
        where_kept = kept_now()
        if where_kept and resume_hint(exc):
            typer.echo(f"scored groups are kept in {where_kept}; run the same command again to resume", err=True)
        raise typer.Exit(code) from None


def _blamed_option(message: str) -> tuple[str, str] | None:
    """(option, rest of the message) when ``message`` starts by naming an option of the
    running command, as its flag (``--bench 'x' is …``) or as its config field
    (``resamples must be …``, ``ServerConfig.port is …``); None otherwise (or outside a command)."""
    ctx = _RUNNING.get()
    if ctx is None:
        return None
    head, sep, rest = message.partition(" ")
    head = head.rstrip(":")
    if re.fullmatch(r"[A-Z]\w*\.\w+", head):  # "ServerConfig.port is …": the field of a config
        head = head.split(".")[1]
    for param in ctx.command.params:
        if param.param_type_name != "option" or not param.opts:
            continue
        flag = param.opts[0]
        if head in (flag, param.name) and sep:
            return flag, rest[len("is ") :] if rest.startswith("is ") else rest
    return None


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
    typer.Option("--max-tokens",
                 help="Length each sequence is cut to, with --truncation (from 2 to the model's max length).",
                 show_default=False),
]
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
    return f"Bootstrap resamples behind each interval ({least} to {RESAMPLES_MAX:,}; {why})."


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
