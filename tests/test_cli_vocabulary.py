"""One vocabulary on the command line: every command's and subcommand's ``--help``, rendered at
200 columns, is walked and checked for what a new user trips over.

* a placeholder that is a type name (``<str>``, ``<list[Path]>``, ``<float>``, ``{OUT}``) instead
  of what goes there (``URL``, ``FILE``, ``DIR``, ``N``, ``SECONDS``);
* a config field name (``fair_share``, ``judge_url``) in help where a flag exists;
* one option spelled two ways across commands (the same flag with other aliases or another
  destination; the same help under two flags), and a wait or timeout outside the one scheme
  ``--wait-<what is waited for>-s``;
* a choice option whose choices are not listed, and a default written ``900.0`` beside ``30``.

The old spellings keep working as hidden aliases that print one deprecation line naming the
new flag (:data:`rmserve.cli_common.DEPRECATED_FLAGS`).
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from rmserve.cli import app

runner = CliRunner()

WIDTH = 200


def _commands() -> list[tuple[tuple[str, ...], object]]:
    root = typer.main.get_command(app)
    found: list[tuple[tuple[str, ...], object]] = [((), root)]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        found.append(((name,), command))
        for sub_name, sub in getattr(command, "commands", {}).items():
            found.append(((name, sub_name), sub))
    return found


COMMANDS = _commands()
IDS = [" ".join(argv) or "rmserve" for argv, _ in COMMANDS]
BY_PATH = dict(COMMANDS)


def _help(argv: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*argv, "--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.stdout


def _options(command) -> list:
    """The visible options of ``command`` (typer's own click classes: checked by kind, not class)."""
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden and p.name != "help"]


def _choices(param) -> tuple[str, ...] | None:
    """The choices of a choice option (typer ≥ 0.29 describes types in ``type_descriptor``)."""
    desc = getattr(param, "type_descriptor", None)
    raw = (desc.choices if desc.is_choice else None) if desc is not None else getattr(param.type, "choices", None)
    return tuple(str(getattr(c, "value", c)) for c in raw) if raw else None


def _is_choice(param) -> bool:
    return _choices(param) is not None


def _record(argv: tuple[str, ...], param) -> tuple[str, str]:
    command = BY_PATH[argv]
    ctx = command.make_context(" ".join(["rmserve", *argv]), ["--help"], resilient_parsing=True)
    record = param.get_help_record(ctx)
    assert record is not None
    return record


TYPE_NAMES = re.compile(
    r"<(?:list\[|tuple|str|int|float|path|bool|text|integer|datetime|file|dir|choice)[^>]*>|(?-i:\b(?:TEXT|INTEGER|FLOAT|BOOLEAN)\b)",
    re.IGNORECASE,
)
BRACES = re.compile(r"\{[^}\s]*\}")
PLACEHOLDER = re.compile(r"(?:\[[A-Z=]+\])?[A-Z][A-Z0-9_]*(?:[=|,][A-Z][A-Z0-9_]*|\[[^\]]+\])*(?:\.\.\.)?")
"""What goes after an option's flag: words in capitals (``URL``, ``NAME=PATH[,KEY=VALUE]``,
``DIR|GLOB``, ``BENCH[,BENCH]``) — or, for a choice option, its choices joined by ``|``."""
SNAKE = re.compile(r"(?<![\w.$/-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w-])")
ODD_DEFAULT = re.compile(r"\[default: -?\d+\.0\]")


def _all_dests() -> dict[str, str]:
    """Destination → primary flag of every visible option of the CLI."""
    return {p.name: p.opts[0] for _, command in COMMANDS for p in _options(command)}


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_placeholders_say_what_goes_there(argv, command):
    text = _help(argv)
    assert not TYPE_NAMES.search(text), f"a type name as placeholder: {TYPE_NAMES.search(text).group(0)!r}"
    assert not BRACES.search(text), f"a placeholder in braces: {BRACES.search(text).group(0)!r}"
    for param in command.params:
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        names, _ = _record(argv, param)
        if param.param_type_name == "option":
            if param.is_flag:
                continue
            placeholder = names.split(" / ")[0].split(" ", 1)[-1].split(", ")[-1].split(" ", 1)[-1]
        else:
            placeholder = names
        choices = _choices(param)
        if choices and placeholder == "HEAD":  # --head: its choices passed 80 columns; its help lists each
            assert all(f"``{c}``" in (param.help or "") or c in (param.help or "") for c in choices), (names, choices)
        elif choices:
            assert placeholder == "|".join(choices), (names, choices)
        else:
            assert PLACEHOLDER.fullmatch(placeholder), f"{names}: placeholder {placeholder!r}"


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_help_names_flags_not_config_fields(argv, command):
    text = _help(argv)
    dests = _all_dests()
    fields = sorted({t for t in SNAKE.findall(text) if t in dests})
    assert not fields, f"config names where flags exist: {[(f, dests[f]) for f in fields]}"
    assert not re.search(r"(?:^|[;:.] )(?:false|true) = ", text, re.MULTILINE), "a boolean field's value, not its flag"


def test_one_spelling_per_option_across_commands():
    seen: dict[str, tuple[str, list[str], str]] = {}
    dests: dict[str, tuple[str, list[str]]] = {}
    helps: dict[str, tuple[str, str]] = {}
    for argv, command in COMMANDS:
        where = " ".join(argv)
        for param in _options(command):
            opts = sorted(param.opts + param.secondary_opts)
            for flag in param.opts:  # a flag has the same spellings wherever it is
                if flag in seen:
                    first, first_opts, _ = seen[flag]
                    assert opts == first_opts, f"{flag}: {opts} in {where}, {first_opts} in {first}"
                else:
                    seen[flag] = (where, opts, param.name)
            if param.name in dests:  # a destination has the same flag wherever it is
                first, first_opts = dests[param.name]
                assert opts == first_opts, f"{param.name}: {opts} in {where}, {first_opts} in {first}"
            dests.setdefault(param.name, (where, opts))
            flat = " ".join((param.help or "").split()).split("  [default:")[0]
            if flat in helps and helps[flat][1] != param.opts[0]:
                pytest.fail(f"one meaning, two flags: {param.opts[0]} in {where}, {helps[flat][1]} in {helps[flat][0]}")
            helps.setdefault(flat, (where, param.opts[0]))


DURATIONS_THAT_ARE_NOT_WAITS = {"--lease-idle-s"}
"""Options in seconds that are not how long something is waited for."""


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_every_wait_is_named_wait_what_s(argv, command):
    for param in _options(command):
        flag = param.opts[0]
        in_seconds = flag.endswith("-s") or param.metavar == "SECONDS" or "seconds" in (param.help or "").lower()
        if not in_seconds or flag in DURATIONS_THAT_ARE_NOT_WAITS or param.is_flag:
            continue
        assert re.fullmatch(r"--wait-[a-z]+(?:-[a-z]+)*-s", flag), f"{flag} in {' '.join(argv)}"
        assert param.metavar == "SECONDS", f"{flag}: {param.metavar}"


CHOICES = {
    ("serve", "log_level"): ("debug", "info", "warning", "error"),
    ("serve", "dtype"): ("auto", "float32", "bfloat16", "float16"),
    ("run", "dtype"): ("auto", "float32", "bfloat16", "float16"),
    ("demo-model", "head"): ("reward", "causal"),
    ("metrics compare", "bench"): ("rm-bench", "rewardbench2"),
    ("sweep", "bench"): ("rm-bench", "rewardbench2"),
    ("metrics rm-bench", "dpo_reward"): ("avg", "sum", "norm", "reference"),
    ("metrics compare", "domain"): ("chat", "math", "code", "safety-refuse", "safety-response"),
}
"""Options that take one of a few values, and the values their help must list."""


@pytest.mark.parametrize(("where", "dest"), list(CHOICES), ids=[f"{w} {d}" for w, d in CHOICES])
def test_a_choice_option_lists_its_choices(where, dest):
    argv = tuple(where.split())
    param = next((p for p in _options(BY_PATH[argv]) if p.name == dest), None)
    assert param is not None, f"{where} has no option {dest}"
    names, help_text = _record(argv, param)
    for choice in CHOICES[(where, dest)]:
        assert re.search(rf"(?<![\w-]){re.escape(choice)}(?![\w-])", names + " " + help_text), (choice, names)


def test_choice_options_are_choices_everywhere():
    """A destination that is a choice in one command is a choice (listed) in every command."""
    choice_dests = {p.name for _, c in COMMANDS for p in _options(c) if _is_choice(p)}
    for argv, command in COMMANDS:
        for param in _options(command):
            if param.name in choice_dests and param.name not in ("bench",):  # sweep's --bench takes a list
                assert _is_choice(param), f"{param.opts[0]} in {' '.join(argv)} is free text"
    from rmserve.metrics.dpo import DPO_REWARDS
    from rmserve.schema import RMBENCH_DOMAINS

    assert CHOICES[("metrics rm-bench", "dpo_reward")] == DPO_REWARDS
    assert CHOICES[("metrics compare", "domain")] == tuple(RMBENCH_DOMAINS)


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_defaults_are_written_one_way(argv, command):
    text = _help(argv)
    assert not ODD_DEFAULT.search(text), ODD_DEFAULT.search(text).group(0)


def test_every_server_command_takes_server():
    talks = {argv for argv, c in COMMANDS if any(p.name == "token_file" for p in c.params)}
    # cluster status finds its servers through Ray, by the set's name, not by --server.
    assert talks == {("eval",), ("sweep",), ("models", "list"), ("models", "load"), ("models", "release"),
                     ("cluster", "status")}
    for argv in talks - {("cluster", "status")}:
        (server,) = [p for p in _options(BY_PATH[argv]) if "--server" in p.opts]
        assert server.opts == ["--server"] and server.metavar == "URL", (argv, server.opts)


def test_each_command_says_only_its_own_outputs():
    out = next(p for p in _options(BY_PATH[("metrics", "rewardbench2")]) if p.name == "out")
    assert "RM-Bench" not in out.help
    assert "heatmap" in next(p for p in _options(BY_PATH[("metrics", "rm-bench")]) if p.name == "out").help
    assert not any(p.opts[0] == "--kind" for p in _options(BY_PATH[("demo-model",)])), "--kind is serve's"


def _parsed(argv: tuple[str, ...], args: list[str]) -> dict:
    command = BY_PATH[argv]
    ctx = command.make_context(" ".join(["rmserve", *argv]), args)
    return ctx.params


BASE = {
    ("eval",): ["--server", "http://127.0.0.1:1", "--bench", "rm-bench", "--data", "d", "--out", "o"],
    ("run",): ["m", "--bench", "rm-bench", "--data", "d", "--out", "o"],
    ("sweep",): ["--server", "http://127.0.0.1:1", "--bench", "rm-bench", "--data", "d", "--out", "o"],
    ("models", "list"): ["--server", "http://127.0.0.1:1"],
    ("models", "load"): ["n", "p", "--server", "http://127.0.0.1:1"],
    ("serve",): ["m"],
    ("demo-model",): ["out", "--corpus", "c"],
}

ALIASES = [
    (("eval",), "--ready-timeout-s", "7", "--wait-ready-s", "wait_ready_s", 7.0),
    (("eval",), "--timeout-s", "7", "--wait-request-s", "wait_request_s", 7.0),
    (("eval",), "--max-in-flight", "7", "--max-inflight-groups", "max_inflight_groups", 7),
    (("eval",), "--max-retry-after-s", "7", "--wait-retry-after-s", "wait_retry_after_s", 7.0),
    (("run",), "--startup-timeout-s", "7", "--wait-ready-s", "wait_ready_s", 7.0),
    (("run",), "--timeout-s", "7", "--wait-request-s", "wait_request_s", 7.0),
    (("sweep",), "--server-wait-s", "7", "--wait-ready-s", "wait_ready_s", 7.0),
    (("sweep",), "--load-timeout-s", "7", "--wait-load-s", "wait_load_s", 7.0),
    (("sweep",), "--timeout-s", "7", "--wait-request-s", "wait_request_s", 7.0),
    (("sweep",), "--max-in-flight", "7", "--max-inflight-groups", "max_inflight_groups", 7),
    (("models", "list"), "--url", "http://127.0.0.1:2", "--server", "server", "http://127.0.0.1:2"),
    (("models", "load"), "--timeout-s", "7", "--wait-load-s", "wait_load_s", 7.0),
    (("serve",), "--swap-wait-s", "7", "--wait-swap-s", "wait_swap_s", 7.0),
    (("serve",), "--swap-drain-timeout-s", "7", "--wait-drain-s", "wait_drain_s", 7.0),
    (("demo-model",), "--kind", "causal", "--head", "head", "causal"),
]


@pytest.mark.parametrize(("argv", "old", "value", "new", "dest", "expected"), ALIASES,
                         ids=[f"{' '.join(a[0])} {a[1]}" for a in ALIASES])
def test_an_old_spelling_still_works_and_names_the_new_flag(argv, old, value, new, dest, expected, capsys):
    args = list(BASE[argv])
    if old == "--url":
        args = [a for a in args if a not in ("--server", "http://127.0.0.1:1")]
    params = _parsed(argv, [*args, old, value])
    assert params[dest] == expected
    assert capsys.readouterr().err == f"warning: {old} is deprecated; use {new}\n"
    params = _parsed(argv, [*args, f"{old}={value}"])
    assert params[dest] == expected
    assert capsys.readouterr().err == f"warning: {old} is deprecated; use {new}\n"
    assert not any(old in p.opts for p in _options(BY_PATH[argv])), f"{old} is still a visible option"
    assert re.search(rf"(?<![\w-]){re.escape(new)}(?![\w-])", _help(argv))


def test_an_old_spelling_is_not_rewritten_where_it_never_existed(capsys):
    result = runner.invoke(app, ["serve", "m", "--max-in-flight", "3"])
    assert result.exit_code == 2
    assert "No such option: --max-in-flight" in result.stderr


def test_a_model_spec_takes_its_keys_as_the_flags_spell_them():
    from rmserve.server.config import ModelSpec

    expected = ModelSpec(name="a", path="/p", gpu_memory_utilization=0.3, kv_cache_memory_bytes=1024)
    assert ModelSpec.parse("a=/p,gpu-memory-utilization=0.3,kv-cache-memory-bytes=1024") == expected
    assert ModelSpec.parse("a=/p,gpu_memory_utilization=0.3,kv_cache_memory_bytes=1024") == expected


ENGINE_COMMANDS = "rmserve serve, rmserve run, rmserve cluster up"
"""The commands that take the engine options."""


@pytest.mark.parametrize(("argv", "flag", "owners", "tip"), [
    (["run", "m/x", "--server", "http://127.0.0.1:1"], "--server",
     "rmserve eval, rmserve sweep, rmserve models list, rmserve models load, rmserve models release",
     "use rmserve eval --server URL"),
    (["eval", "--server", "http://127.0.0.1:1", "--dtype", "float32"], "--dtype", ENGINE_COMMANDS,
     "whose engine options are given to rmserve serve"),
    (["eval", "--server", "http://127.0.0.1:1", "--kind", "judge"], "--kind", ENGINE_COMMANDS,
     "rmserve run starts a server with them"),
    (["sweep", "--server", "http://127.0.0.1:1", "--dtype", "float32"], "--dtype", ENGINE_COMMANDS,
     "loads each checkpoint into a running server"),
    (["models", "load", "--dtype", "float32"], "--dtype", ENGINE_COMMANDS, None),
])
def test_an_option_of_another_command_says_whose_it_is(argv, flag, owners, tip):
    result = runner.invoke(app, argv, terminal_width=400)
    assert result.exit_code == 2
    here = " ".join(argv[:2] if argv[0] == "models" else argv[:1])
    error = " ".join(result.stderr.split())
    assert f"No such option: {flag} (it is an option of {owners}, not of rmserve {here})" in error
    assert "Possible options" not in error  # click's spelling guesses (--seed for --server) are noise here
    if tip:
        assert tip in error


def test_an_unknown_option_of_no_command_keeps_the_spelling_guess():
    result = runner.invoke(app, ["eval", "--serve", "http://127.0.0.1:1"], terminal_width=400)
    assert result.exit_code == 2
    error = " ".join(result.stderr.split())
    assert "No such option: --serve" in error and "--server" in error and "it is an option of" not in error


# --- defaults, ranges, outputs and reasons, said one way ----------------------------------------


def _is_int(param) -> bool:
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        return desc.annotation is int and not desc.is_choice
    return getattr(param.type, "name", "") == "integer"


def _flat(text: str | None) -> str:
    return " ".join((text or "").split())


ENGINE_INT_RANGES = {
    "--judge-max-tokens": "≥ 1", "--judge-seed": "≥ 0", "--max-model-len": "≥ 16", "--block-size": "8 to 256",
    "--kv-cache-memory-bytes": "≥ 1048576", "--tensor-parallel-size": "≥ 1", "--data-parallel-size": "≥ 1",
    "--hf-batch-size": "≥ 1", "--max-num-batched-tokens": "≥ 16", "--max-num-seqs": "≥ 1",
    "--label-index": "≥ 0", "--head-token-id": "≥ 0",
}
SCORING_INT_RANGES = {
    "--max-inflight-groups": "1 to 4096", "--groups-per-request": "1 to --max-inflight-groups",
    "--resamples": "0 to 1000000", "--seed": "≥ 0", "--max-tokens": "2 to the model's max length",
}
INT_RANGES: dict[tuple[str, str], str] = {
    **{("serve", flag): r for flag, r in {
        "--port": "0 to 65535", "--max-body-bytes": "≥ 1024", "--max-inflight-groups": "≥ 0",
        "--result-cache-groups": "≥ 0", "--engine-concurrency-groups": "≥ 1", "--engine-window-tokens": "≥ 0",
        "--fair-share-quantum-tokens": "≥ 1", "--parent-pid": "≥ 1", **ENGINE_INT_RANGES}.items()},
    **{("run", flag): r for flag, r in {**SCORING_INT_RANGES, **ENGINE_INT_RANGES}.items()},
    **{("eval", flag): r for flag, r in {**SCORING_INT_RANGES, "--replicas": "≥ 1"}.items()},
    **{("sweep", flag): r for flag, r in {"--max-inflight-groups": "1 to 4096", "--resamples": "1 to 1000000",
                                          "--seed": "≥ 0", "--max-tokens": "2 to the model's max length",
                                          "--replicas": "≥ 1"}.items()},
    **{("cluster up", flag): r for flag, r in {**ENGINE_INT_RANGES, "--replicas": "≥ 1"}.items()},
    **{("demo-model", flag): r for flag, r in {
        "--layers": "≥ 1", "--hidden": "≥ 1", "--heads": "≥ 1", "--kv-heads": "≥ 1", "--intermediate": "≥ 1",
        "--vocab": "300 to 65536", "--seed": "≥ 0", "--max-len": "≥ 16", "--num-labels": "1 to 64",
        "--objectives": "1 to 64"}.items()},
    ("metrics rm-bench", "--resamples"): "0 to 1000000", ("metrics rm-bench", "--seed"): "≥ 0",
    ("metrics rewardbench2", "--resamples"): "0 to 1000000", ("metrics rewardbench2", "--seed"): "≥ 0",
    ("metrics compare", "--resamples"): "1 to 1000000", ("metrics compare", "--seed"): "≥ 0",
    ("users add", "--max-inflight-groups"): "≥ 1", ("users add", "--tokens-per-minute"): "≥ 1",
}
"""Every integer option of the CLI and the range its help states, in the one form: ``(A to B)`` or
``(≥ A)``, numbers written as typed (no digit grouping), optionally followed by ``;`` or ``,`` and
a note inside the same parentheses."""

OTHER_RANGE_FORMS = re.compile(r"\d\s*[–-]\s*\d|\bfrom \d+ to\b|\bbetween \d|\d,\d{3}|(?<!\()≥ \d|\[\d+, \d+\]")
"""Ways of writing a range other than the one form (``1–4096``, ``0-65535``, ``from 8 to 256``,
``1,000,000``, a bare ``, ≥ 1``)."""


def test_every_integer_option_states_its_range_in_one_form():
    found = {(" ".join(argv), p.opts[0]): p for argv, c in COMMANDS for p in _options(c) if _is_int(p)}
    assert sorted(found) == sorted(INT_RANGES), "an integer option without a stated range, or one no longer there"
    for (where, flag), param in found.items():
        text = _flat(param.help)
        expected = INT_RANGES[(where, flag)]
        assert re.search(rf"\({re.escape(expected)}[);,]", text), f"{where} {flag}: ({expected}) not in {text!r}"
        assert not OTHER_RANGE_FORMS.search(text), f"{where} {flag}: {OTHER_RANGE_FORMS.search(text).group(0)!r}"


@pytest.mark.parametrize(("args", "message"), [
    (["--groups-per-request", "33"], "Invalid value for '--groups-per-request': must be an integer in [1, 32], got 33"),
    (["--groups-per-request", "0"], "Invalid value for '--groups-per-request': must be an integer in [1, 32], got 0"),
    (["--max-inflight-groups", "4097"],
     "Invalid value for '--max-inflight-groups': must be an integer in [1, 4096], got 4097"),
])
def test_the_stated_range_is_the_one_enforced(tmp_path, args, message):
    result = runner.invoke(app, ["eval", *BASE[("eval",)], *args], terminal_width=400)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


BYTE_DEFAULTS = {
    ("serve", "--max-body-bytes"): "[default: 33554432 (32 MiB)]",
    ("serve", "--kv-cache-memory-bytes"): (
        "[default: vLLM's choice on GPU; on the CPU build VLLM_CPU_KVCACHE_SPACE GiB when set, else 4294967296 (4 GiB)]"),
    ("run", "--kv-cache-memory-bytes"): (
        "[default: vLLM's choice on GPU; on the CPU build VLLM_CPU_KVCACHE_SPACE GiB when set, else 4294967296 (4 GiB)]"),
    ("cluster up", "--kv-cache-memory-bytes"): (
        "[default: vLLM's choice on GPU; on the CPU build VLLM_CPU_KVCACHE_SPACE GiB when set, else 4294967296 (4 GiB)]"),
}
SIZE = re.compile(r"(\d+(?:\.\d+)?) ([KMGT]iB)")


def test_byte_options_write_defaults_and_limits_in_bytes_the_unit_they_take():
    from rmserve.server.config import ServerConfig

    found = {(" ".join(argv), p.opts[0]): p for argv, c in COMMANDS for p in _options(c) if p.metavar == "BYTES"}
    assert sorted(found) == sorted(BYTE_DEFAULTS)
    for key, param in found.items():
        text = _flat(param.help)
        assert text.endswith(BYTE_DEFAULTS[key]), (key, text)
        for size in SIZE.finditer(text):  # a size in MiB/GiB only as a gloss on a number of bytes
            before = text[: size.start()]
            assert re.search(r"\d+ \($|\d+, $", before), f"{key}: {size.group(0)!r} without the bytes before it"
    assert ServerConfig().max_body_bytes == 33554432  # the default as written is the default


def test_every_default_is_written_by_with_default():
    for argv, command in COMMANDS:
        for param in [*_options(command), *(p for p in command.params if p.param_type_name == "argument")]:
            text = param.help or ""
            if "[default:" in text:
                assert text.count("[default:") == 1 and re.fullmatch(r"(?s)(?:.*\S  )?\[default: [^\]]+\]", text), (
                    f"{' '.join(argv)} {param.name}: a default not written by with_default: {text!r}")
    expires = next(p for p in _options(BY_PATH[("users", "add")]) if p.name == "expires")
    assert expires.help == "Time the token stops working, with a zone (2027-03-31T00:00:00Z).  [default: never]"


MODULE_NAME = re.compile(r"\brmserve(?:\.[a-z_]+)+")


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_help_says_what_an_option_does_not_which_module_does_it(argv, command):
    text = _help(argv)
    assert not MODULE_NAME.search(text), MODULE_NAME.search(text).group(0)
    if argv == ("serve",):
        cache = next(p for p in _options(command) if p.name == "result_cache_groups")
        assert cache.help == (
            "Recent group results kept (≥ 0; 0 = off) so that a group sent again (a resumed or retrying client) is "
            "answered at once, without engine work: the same token ids for the same model fingerprint get the first "
            "reply's rewards. Cleared by a checkpoint swap.  [default: 100000]"
        )


def test_heatmaps_are_said_to_be_rm_bench_only_where_a_command_takes_either_benchmark():
    helps = {where: next(p for p in _options(BY_PATH[where]) if p.name == "out").help for where in (("eval",), ("run",))}
    assert helps[("eval",)] == (
        "Output folder: scores.jsonl (the same command resumes from it), results.json, table.md and, with "
        "--bench rm-bench only, the heatmap PNGs."
    )
    assert helps[("run",)] == (
        "Output folder: scores.jsonl (the same command resumes from it), results.json, table.md and, with "
        "--bench rm-bench only, the heatmap PNGs, and server.log (the server's output)."
    )
    for argv, command in COMMANDS:
        takes_both = any(p.name == "bench" for p in _options(command))
        for param in _options(command):
            if takes_both and "heatmap" in (param.help or ""):
                assert "--bench rm-bench only" in param.help, (argv, param.opts[0])


def test_demo_model_help_names_the_flags_its_rules_are_about():
    helps = {p.opts[0]: p.help for p in _options(BY_PATH[("demo-model",)])}
    assert helps["--hidden"] == (
        "Hidden size (≥ 1): a multiple of --heads, with a head dim (--hidden/--heads) of at least 32.")
    assert helps["--kv-heads"] == "Key/value heads (≥ 1; must divide --heads)."
    for flag, text in helps.items():
        assert not re.search(r"(?<![\w-])(?:hidden|heads|kv_heads)/|divides heads|hidden/heads", text), (flag, text)


STORE_WHY = (
    "rmserve eval and run keep their scores in OUT/scores.jsonl and use a store only when asked; rmserve sweep "
    "keeps its scores only in a store, so it always uses one"
)
WAIT_READY_WHY = (
    "600 by default for a running server; rmserve run waits 1800 by default, as it also starts the server and "
    "loads the model"
)


def test_options_whose_defaults_differ_between_commands_say_why_in_each():
    def option(argv, name):
        return next(p for p in _options(BY_PATH[argv]) if p.name == name)

    for argv in (("eval",), ("run",)):
        store = option(argv, "store")
        assert store.help == (
            "Score store (SQLite) shared across runs: groups stored for the server's model fingerprint are not sent "
            f"again, new ones are added ({STORE_WHY}).  [default: $RMSERVE_STORE when set, else no store]"
        )
        assert option(argv, "no_store").opts == ["--no-store"]
    sweep_store = option(("sweep",), "store")
    assert sweep_store.help == (
        "Score store (SQLite) shared across runs: scores are kept there as they arrive, and groups stored for a "
        f"checkpoint's fingerprint are not sent again ({STORE_WHY}; there is no --no-store here).  "
        "[default: $RMSERVE_STORE when set, else ~/.local/share/rmserve/scores.sqlite]"
    )
    assert not any(p.name == "no_store" for p in _options(BY_PATH[("sweep",)]))

    assert (option(("eval",), "wait_ready_s").default, option(("sweep",), "wait_ready_s").default,
            option(("run",), "wait_ready_s").default) == (600, 600, 1800)
    assert option(("eval",), "wait_ready_s").help == (
        f"Longest wait for a server to be ready (its /health answering 200: the model loaded), seconds; {WAIT_READY_WHY}."
    )
    assert option(("sweep",), "wait_ready_s").help == (
        "Longest wait for a server to be ready (its /health answering 200: the model loaded), seconds, at the start "
        f"(with --wait-for-server) and for a server that stopped answering; {WAIT_READY_WHY}."
    )
    assert option(("run",), "wait_ready_s").help == (
        "Longest wait for the server started here to be ready (its model loaded), seconds; 1800 by default, longer "
        "than the 600 of rmserve eval and sweep (which wait for a running server), as run also starts the server and "
        "loads the model."
    )
