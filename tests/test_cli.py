"""The command line's shared plumbing: engine options declared once, one exit-code rule,
serve's logging and its parent watch."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from rmserve import cli_common
from rmserve.cli import app
from rmserve.errors import DataError, EngineNotReady, FingerprintMismatch, ServerFault
from rmserve.server.config import EngineConfig, resolve_dtype
from testkit.processes import parent_killed, wait_exited

runner = CliRunner()

ENGINE_FIELDS = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]


def _click_options(command: str) -> dict[str, object]:
    """Parameter name → click parameter of an ``rmserve`` command."""
    group = typer.main.get_command(app)
    return {param.name: param for param in group.commands[command].params}  # type: ignore[attr-defined]


@pytest.fixture
def captured(monkeypatch):
    """``rmserve serve`` with the real parsing but no server: records (EngineConfig, ServerConfig, parent pid)."""
    import rmserve.cli_server as cli_server
    import rmserve.server.http.serve as serve_module

    calls = []
    watched = []
    monkeypatch.setattr(serve_module, "serve", lambda e, s, *, announce=print: calls.append((e, s)) or 0)
    monkeypatch.setattr(serve_module, "configure_logging", lambda level: None)
    monkeypatch.setattr("rmserve.server.http.group_reaper.start_group_reaper", lambda: None)  # pytest's own group
    monkeypatch.setattr(cli_server, "watch_parent", lambda pid: watched.append(pid))
    return calls, watched


def test_serve_and_run_declare_every_engine_field_with_the_same_option_and_help():
    serve, run = _click_options("serve"), _click_options("run")
    for name in ENGINE_FIELDS:
        flag = "--" + name.replace("_", "-")
        assert serve[name].opts == run[name].opts == [flag], name
        assert serve[name].help == run[name].help, name
        assert serve[name].help, f"{name} has no attribute docstring"
        assert serve[name].default is None and run[name].default is None, name  # not given = EngineConfig default
    # Help comes from the attribute docstring, its "None = X" clause or the field's default
    # written as [default: X]; reST markup is dropped.
    assert serve["max_num_seqs"].help == "Most sequences in one vLLM engine step (≥ 1).  [default: vLLM's default]"
    assert serve["gpu_memory_utilization"].help == (
        "Fraction of accelerator memory vLLM may use, in (0, 1].  [default: 0.9]"
    )
    assert serve["enforce_eager"].help.endswith("[default: --no-enforce-eager]")
    assert serve["engine"].help == (
        "Backend name: vllm (embedded AsyncLLM, prefix cache) or hf (transformers).  [default: vllm]"
    )
    # Switches can be given either way.
    assert serve["enable_prefix_caching"].secondary_opts == ["--no-enable-prefix-caching"]
    assert serve["enforce_eager"].secondary_opts == ["--no-enforce-eager"]
    # The help records click renders are the same too.
    group = typer.main.get_command(app)
    serve_ctx = group.make_context("rmserve", ["serve", "--help"], resilient_parsing=True)  # type: ignore[attr-defined]
    assert serve["max_num_seqs"].get_help_record(serve_ctx) == run["max_num_seqs"].get_help_record(serve_ctx)


def test_serve_options_argv_round_trips_through_the_serve_parser(captured, tmp_path):
    from rmserve.pipelines.launch import ServeOptions
    from rmserve.server.http.app import ServerConfig

    template = tmp_path / "t.jinja"
    template.write_text("{{ bos_token }}")
    values = {
        "engine": "hf",
        "dtype": "bfloat16",
        "max_model_len": 512,
        "block_size": 64,
        "gpu_memory_utilization": 0.5,
        "kv_cache_memory_bytes": 2 * 1024 * 1024,
        "tensor_parallel_size": 2,
        "data_parallel_size": 2,
        "scheduling_policy": "priority",
        "chat_template": template,
        "enforce_eager": True,
        "served_model_name": "rm",
        "hf_batch_size": 3,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": 256,
        "max_num_seqs": 7,
        "cpu_threads_bind": "0|1|2|3",
        "kind": "dpo",
        "ref_model": "org/ref",
        "compat": "official",
    }
    judge_values = {
        "protocol": "ratings",
        "judge_max_tokens": 32,
        "judge_seed": 7,
        "judge_url": "http://judge.example:8000/v1",
        "judge_model": "judge-7b",
        "judge_api_key_env": "JUDGE_KEY",
        "judge_system_prompt": False,
        "judge_thinking": "off",
    }
    head_values = ({"head": "multi-label", "label_weights": "0.5,1,-2"}, {"label_index": 2},
                   {"head": "lm-logit", "head_token_id": 5}, {"head": "remote-code", "trust_remote_code": True})
    # ref_free excludes ref_model, the judge options need kind judge, length_sign kind length and
    # the head options kind classifier: they are carried in the round trips after the first.
    head_fields = {name for options in head_values for name in options}
    assert sorted([*values, "ref_free", *judge_values, "length_sign", *head_fields]) == sorted(ENGINE_FIELDS), (
        "give the new EngineConfig field a non-default value here"
    )
    defaults = EngineConfig(model="m")
    assert all(getattr(defaults, name) != value for name, value in values.items())  # each one is really carried
    options = ServeOptions(model="org/rm", engine_options=values)
    argv = options.argv("127.0.0.1", 5123)
    assert argv[:4] == [sys.executable, "-m", "rmserve.cli", "serve"]
    result = runner.invoke(app, argv[3:])
    assert result.exit_code == 0, result.output
    calls, watched = captured
    assert calls == [(EngineConfig(model="org/rm", **values), ServerConfig(host="127.0.0.1", port=5123, served_model_name="rm"))]
    assert watched == [os.getpid()]
    calls.clear()
    ref_free = {**values, "ref_model": None, "ref_free": "norm"}
    ref_free.pop("ref_model")
    argv = ServeOptions(model="org/rm", engine_options=ref_free).argv("127.0.0.1", 5123)
    result = runner.invoke(app, argv[3:])
    assert result.exit_code == 0, result.output
    assert calls[0][0] == EngineConfig(model="org/rm", **ref_free)
    calls.clear()
    judge = {**{k: v for k, v in values.items() if k not in ("ref_model", "compat")}, "kind": "judge", **judge_values}
    assert all(getattr(defaults, name) != value for name, value in judge_values.items())
    argv = ServeOptions(model="org/rm", engine_options=judge).argv("127.0.0.1", 5123)
    result = runner.invoke(app, argv[3:])
    assert result.exit_code == 0, result.output
    assert calls[0][0] == EngineConfig(model="org/rm", **judge)
    calls.clear()
    length = {**{k: v for k, v in values.items() if k not in ("ref_model", "compat")}, "kind": "length",
              "length_sign": "shortest"}
    assert defaults.length_sign != "shortest"
    argv = ServeOptions(model="org/rm", engine_options=length).argv("127.0.0.1", 5123)
    result = runner.invoke(app, argv[3:])
    assert result.exit_code == 0, result.output
    assert calls[0][0] == EngineConfig(model="org/rm", **length)
    for options in head_values:
        calls.clear()
        assert all(getattr(defaults, name) != value for name, value in options.items())
        head = {**{k: v for k, v in values.items() if k not in ("ref_model", "kind")}, **options}
        argv = ServeOptions(model="org/rm", engine_options=head).argv("127.0.0.1", 5123)
        result = runner.invoke(app, argv[3:])
        assert result.exit_code == 0, result.output
        assert calls[0][0] == EngineConfig(model="org/rm", **head)


def test_engine_options_not_given_keep_the_engine_config_defaults(captured):
    result = runner.invoke(app, ["serve", "m", "--no-enforce-eager", "--max-num-seqs", "4"])
    assert result.exit_code == 0, result.output
    (engine_config, _), = captured[0]
    assert engine_config == EngineConfig(model="m", max_num_seqs=4)
    assert captured[1] == []  # no --parent-pid, no watch


def test_run_refuses_a_bad_engine_value_before_starting_anything(small_rmbench, tmp_path):
    result = runner.invoke(app, [
        "run", "some/rm", "--bench", "rm-bench", "--data", str(small_rmbench), "--out", str(tmp_path),
        "--block-size", "24",
    ])
    assert result.exit_code == 2
    assert "Invalid value for '--block-size': 24 must be a power of 2 between 8 and 256" in " ".join(result.output.split())
    assert not (tmp_path / "server.log").exists()


def test_with_engine_options_refuses_a_command_that_redeclares_one():
    def command(dtype: str, engine_options: dict) -> None: ...

    with pytest.raises(TypeError, match=r"\['dtype'\] clash with engine options"):
        cli_common.with_engine_options(command)


def test_with_option_group_puts_the_group_in_place_and_hands_it_over_as_one_dict():
    group = {
        "alpha": (Annotated[int, typer.Option("--alpha")], 1),
        "beta": (Annotated[bool, typer.Option("--beta")], False),
    }
    seen = {}

    @cli_common.with_option_group("shared", group)
    def command(first: Annotated[str, typer.Option("--first")] = "a", *, shared: dict, last: int = 0) -> None:
        seen.update(first=first, shared=shared, last=last)

    assert list(inspect.signature(command).parameters) == ["first", "alpha", "beta", "last"]
    command_app = typer.Typer()
    command_app.command()(command)
    result = CliRunner().invoke(command_app, ["--alpha", "7", "--beta"])
    assert result.exit_code == 0, result.output
    assert seen == {"first": "a", "shared": {"alpha": 7, "beta": True}, "last": 0}


def test_with_option_group_refuses_a_missing_placeholder_or_a_clash():
    group = {"alpha": (int, 1)}

    def no_placeholder(alpha: int = 1) -> None: ...

    def clash(alpha: int = 1, *, shared: dict) -> None: ...

    with pytest.raises(TypeError, match="has no shared parameter"):
        cli_common.with_option_group("shared", group)(no_placeholder)
    with pytest.raises(TypeError, match=r"\['alpha'\] clash with the shared options"):
        cli_common.with_option_group("shared", group)(clash)


def test_table_lines_are_tab_separated_header_first():
    assert cli_common.table_lines(("a", "b"), [("1", "2"), ("x", "")]) == ["a\tb", "1\t2", "x\t"]


def test_engine_options_of_reads_back_what_engine_argv_writes_and_skips_the_rest():
    from pathlib import Path

    values = {"kind": "dpo", "ref_free": "avg", "dtype": "bfloat16", "max_model_len": 4096, "enforce_eager": True,
              "enable_prefix_caching": False, "chat_template": Path("/t/x.jinja"), "label_weights": "0.5,1"}
    argv = cli_common.engine_argv(values)
    assert cli_common.engine_options_of(argv) == values
    mixed = ["--users-file", "/u.jsonl", "--kind", "dpo", "--port", "9", "--label-index=2", "--no-enforce-eager", "m"]
    assert cli_common.engine_options_of(mixed) == {"kind": "dpo", "label_index": 2, "enforce_eager": False}
    assert cli_common.engine_options_of([]) == {}
    with pytest.raises(ValueError, match="'--max-model-len'"):
        cli_common.engine_options_of(["--max-model-len", "many"])
    with pytest.raises(ValueError, match="'--dtype' requires an argument"):
        cli_common.engine_options_of(["--dtype"])


def test_engine_argv_refuses_unknown_names():
    with pytest.raises(ValueError, match="'max_num_seq' not among"):
        cli_common.engine_argv({"max_num_seq": 3})
    assert cli_common.engine_argv({"max_num_seqs": 3, "dtype": None}) == ["--max-num-seqs", "3"]


# --- exit codes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (KeyboardInterrupt(), 130),
        (ValueError("max_in_flight must be ≥ 1"), 2),
        (DataError("bad record", path="/data/chat.json", line=3), 2),
        (DataError("groups differ between the two files"), 2),
        (DataError("not a usable SQLite score store", path="/runs/s.sqlite"), 1),
        (DataError("line 4: invalid JSON", path="/runs/out/scores.jsonl"), 1),
        (FingerprintMismatch("stored scores belong to fp-old"), 1),
        (EngineNotReady("not ready after 0.5 s"), 1),
        (ServerFault("the server exited with status 3"), 1),
    ],
)
def test_one_exit_code_rule(exc, code):
    own = (Path("/runs/out/scores.jsonl"), "/runs/s.sqlite", None)
    assert cli_common.exit_code(exc, own_files=own) == code


def test_guarded_interrupt_exits_130_naming_what_is_kept(capsys):
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as info:
        cli_common.guarded(interrupted, kept="/runs/out/scores.jsonl")
    assert info.value.exit_code == 130
    assert capsys.readouterr().err == "interrupted; scored groups are kept in /runs/out/scores.jsonl; run again to resume\n"


@pytest.mark.parametrize("scored", [True, False])
def test_eval_interrupted_exits_130_with_a_resume_hint_only_when_something_was_scored(
    monkeypatch, small_rmbench, tmp_path, scored
):
    import rmserve.pipelines.evaluate as evaluate_module

    scores = tmp_path / "o" / "scores.jsonl"

    def interrupted(config):
        if scored:
            scores.parent.mkdir()
            scores.write_text('{"benchmark":"rm-bench","domain":"chat","id":"0","num_chosen":1,"rewards":[1,0]}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "evaluate", interrupted)
    result = runner.invoke(app, [
        "eval", "--server", "http://127.0.0.1:9", "--bench", "rm-bench", "--data", str(small_rmbench),
        "--out", str(tmp_path / "o"), "--quiet",
    ])
    assert result.exit_code == 130
    if scored:
        assert result.stderr == f"interrupted; scored groups are kept in {scores}; run again to resume\n"
    else:
        assert result.stderr == "interrupted\n"


def _sweep_args(tmp_path):
    step = tmp_path / "step-1"
    step.mkdir(exist_ok=True)
    return [
        "sweep", "--server", "http://127.0.0.1:9", "--checkpoints", str(step), "--bench", "rm-bench",
        "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--store", str(tmp_path / "s.sqlite"),
    ]


def test_sweep_corrupt_store_exits_1_and_bad_data_exits_2(monkeypatch, tmp_path):
    import rmserve.pipelines.sweep as sweep_module

    errors = iter([
        DataError("not a usable SQLite score store", path=str(tmp_path / "s.sqlite")),
        DataError("bad record", path=str(tmp_path / "chat.json"), line=2),
    ])

    def failing(config, *, tally):
        raise next(errors)

    monkeypatch.setattr(sweep_module, "sweep", failing)
    store_error = runner.invoke(app, _sweep_args(tmp_path))
    assert store_error.exit_code == 1
    assert store_error.stderr.startswith(f"error: data_error: {tmp_path / 's.sqlite'}: not a usable SQLite")
    data_error = runner.invoke(app, _sweep_args(tmp_path))
    assert data_error.exit_code == 2
    assert data_error.stderr == f"error: data_error: {tmp_path / 'chat.json'}, line 2: bad record\n"


def test_sweep_json_prints_the_returned_document(monkeypatch, tmp_path):
    import rmserve.pipelines.sweep as sweep_module

    document = {"benchmarks": ["rm-bench"], "checkpoints": [], "notes": ["from the result"]}
    result = sweep_module.SweepResult(runs=(), paths=(), summary_md="# summary\n", document=document)
    monkeypatch.setattr(sweep_module, "sweep", lambda config, *, tally: result)
    printed = runner.invoke(app, [*_sweep_args(tmp_path), "--json", "--quiet"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout) == document
    assert not (tmp_path / "o" / "sweep.json").exists()  # nothing was read from disk


# --- dtype ------------------------------------------------------------------------------


def test_resolve_dtype():
    assert resolve_dtype("float16", None) == "float16"  # no torch needed
    assert resolve_dtype("auto", True) == "bfloat16"
    assert resolve_dtype("auto", False) == "float32"
    with pytest.raises(ValueError, match="dtype: 'fp8' is not one of auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", False)


def test_cli_and_launcher_do_not_import_torch(tmp_path):
    from testkit.records import fake_checkpoint

    folder = fake_checkpoint(tmp_path / "rm", b"w")
    code = (
        "import sys\n"
        "import rmserve.cli, rmserve.pipelines.launch as launch\n"
        "from rmserve.pipelines.evaluate import EvalConfig\n"
        f"cfg = launch.RunConfig(launch.ServeOptions(model={str(folder)!r}, engine_options={{'dtype': 'float32'}}),\n"
        f"    EvalConfig(bench='rm-bench', data='d', out_dir={str(tmp_path / 'o')!r}, store={str(tmp_path / 's')!r}))\n"
        "assert launch.store_signature(cfg) is not None\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- serve: logging and the parent watch -------------------------------------------------

_LOGGING_SCRIPT = """
import logging, sys
import rmserve.server.http.serve as serve_module

def fake_serve(engine_config, server_config, *, announce=print):
    logging.getLogger("rmserve.server.swaps.swap").info("in-place swap taken")
    logging.getLogger("rmserve.server.swaps.swap").debug("debug detail")
    logging.getLogger("other.library").info("library chatter")
    logging.getLogger("other.library").warning("library warning")
    return 0

serve_module.serve = fake_serve
from rmserve.cli import app
app(["serve", "m", *sys.argv[1:]])
"""

def _line(level: str, name: str, message: str) -> str:
    """The regular expression of one log line: ``2026-11-30 12:00:00,123 LEVEL logger.name: message``."""
    return r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} " + f"{level} {re.escape(name)}: {re.escape(message)}"


def _serve_log(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="400")  # click's error box: one line per message
    return subprocess.run(
        [sys.executable, "-c", _LOGGING_SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_serve_logs_to_stderr_with_time_level_and_logger_name():
    proc = _serve_log()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert [line for line in lines if re.fullmatch(_line("INFO", "rmserve.server.swaps.swap", "in-place swap taken"), line)]
    assert [line for line in lines if re.fullmatch(_line("WARNING", "other.library", "library warning"), line)]
    assert "debug detail" not in proc.stderr and "library chatter" not in proc.stderr
    assert proc.stdout == ""


def test_serve_log_level_option():
    debug = _serve_log("--log-level", "debug")
    assert debug.returncode == 0, debug.stderr
    assert re.search(_line("DEBUG", "rmserve.server.swaps.swap", "debug detail"), debug.stderr)
    warning = _serve_log("--log-level", "warning")
    assert warning.returncode == 0, warning.stderr
    assert "in-place swap taken" not in warning.stderr and "library warning" in warning.stderr
    bad = _serve_log("--log-level", "loud")
    assert bad.returncode == 2
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in " ".join(bad.stderr.split())


_WATCHED_CHILD = """
import os, sys, time
from rmserve.cli_server import watch_parent
watch_parent(os.getppid(), poll_s=0.05)
print("watching", flush=True)
time.sleep(120)
"""

_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "watching"
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_watch_parent_stops_the_process_when_its_parent_is_sigkilled():
    argv = [sys.executable, "-c", _PARENT, _WATCHED_CHILD]
    with parent_killed(argv) as (child_pid, _):  # SIGKILL: the parent cannot stop its child itself
        assert wait_exited(child_pid, 30.0), f"child {child_pid} still running 30 s after its parent died"


def test_watch_parent_refuses_a_pid_that_is_not_running():
    from rmserve.cli_server import watch_parent

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(ValueError, match=f"--parent-pid: no process {proc.pid} is running"):
        watch_parent(proc.pid)
    with pytest.raises(ValueError, match="must be a positive process id"):
        watch_parent(0)


@pytest.mark.parametrize(
    ("disposition", "server_was_serving", "signalled"),
    [
        (signal.SIG_DFL, False, True),  # engine still being built: the default action ends the process
        ("loop handler", True, True),  # serving: the event loop turns it into a clean stop
        (signal.SIG_DFL, True, False),  # already shutting down: a signal would cut the shutdown short
    ],
)
def test_parent_watch_signals_only_when_it_cannot_cut_a_shutdown_short(
    monkeypatch, disposition, server_was_serving, signalled
):
    import rmserve.cli_server as cli_server

    sent = []
    monkeypatch.setattr(cli_server.signal, "getsignal", lambda sig: disposition)
    monkeypatch.setattr(cli_server.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    cli_server._stop_self(server_was_serving)
    assert sent == ([(os.getpid(), signal.SIGTERM)] if signalled else [])


# --- fair queue and priorities --------------------------------------------------------------


def test_serve_fair_share_options_reach_the_server_config(captured):
    from rmserve.server.http.app import ServerConfig

    result = runner.invoke(app, [
        "serve", "m", "--no-fair-share", "--engine-concurrency-groups", "8", "--fair-share-quantum-tokens", "512",
        "--fair-share-interactive-boost", "2.5",
    ])
    assert result.exit_code == 0, result.output
    (_, server_config), = captured[0]
    assert server_config == ServerConfig(
        fair_share=False, engine_concurrency_groups=8, fair_share_quantum_tokens=512, fair_share_interactive_boost=2.5
    )
    captured[0].clear()
    result = runner.invoke(app, ["serve", "m"])
    assert result.exit_code == 0, result.output
    (_, server_config), = captured[0]
    assert (server_config.fair_share, server_config.engine_concurrency_groups) == (True, 64)  # the defaults


def test_serve_replica_label_reaches_the_server_config(captured):
    result = runner.invoke(app, ["serve", "m", "--replica", "team/1 on node 10.0.0.2, GPUs 0"])
    assert result.exit_code == 0, result.output
    (_, server_config), = captured[0]
    assert server_config.replica == "team/1 on node 10.0.0.2, GPUs 0"


def test_serve_training_log_options_reach_the_server_config(captured, tmp_path):
    from rmserve.server.http.app import ServerConfig

    path = tmp_path / "training.jsonl"
    result = runner.invoke(app, ["serve", "m", "--training-log", str(path), "--training-log-rate", "0.25",
                                 "--training-log-text"])
    assert result.exit_code == 0, result.output
    (_, server_config), = captured[0]
    assert server_config == ServerConfig(training_log=str(path), training_log_rate=0.25, training_log_text=True)
    captured[0].clear()
    result = runner.invoke(app, ["serve", "m"])
    assert result.exit_code == 0, result.output
    (_, server_config), = captured[0]
    assert (server_config.training_log, server_config.training_log_rate, server_config.training_log_text) == (
        None, 1.0, False)  # off by default


@pytest.mark.parametrize(("args", "message"), [
    (lambda d: ["--training-log", str(d / "t.jsonl"), "--training-log-rate", "1.5"],
     "Invalid value for '--training-log-rate': 1.5; it must be a fraction in [0, 1]"),
    (lambda d: ["--training-log-rate", "0.5"],
     "Invalid value for '--training-log-rate': 0.5 but no training log file is given (--training-log FILE)"),
    (lambda d: ["--training-log-text"],
     "Invalid value for '--training-log-text': on but no training log file is given (--training-log FILE)"),
    (lambda d: ["--training-log", str(d / "no" / "t.jsonl")], "Invalid value for '--training-log': the folder of"),
])
def test_serve_refuses_bad_training_log_options_naming_them(captured, tmp_path, args, message):
    result = runner.invoke(app, ["serve", "m", *args(tmp_path)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert captured[0] == []


def test_serve_refuses_a_bad_fair_share_value_naming_the_option(captured):
    result = runner.invoke(app, ["serve", "m", "--fair-share-interactive-boost", "0.5"])
    assert result.exit_code == 2
    assert "Invalid value for '--fair-share-interactive-boost': 0.5; it must be ≥ 1" in " ".join(result.output.split())
    assert captured[0] == []


@pytest.mark.parametrize(("extra", "expected"), [([], "interactive"), (["--priority", "batch"], "batch")])
def test_eval_priority_option_reaches_the_eval_config(monkeypatch, small_rmbench, tmp_path, extra, expected):
    import rmserve.pipelines.evaluate as evaluate_module

    seen = []

    def stop(config):
        seen.append(config.priority)
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "evaluate", stop)
    result = runner.invoke(app, [
        "eval", "--server", "http://127.0.0.1:9", "--bench", "rm-bench", "--data", str(small_rmbench),
        "--out", str(tmp_path / "o"), "--quiet", *extra,
    ])
    assert result.exit_code == 130
    assert seen == [expected]


@pytest.mark.parametrize(("extra", "expected"), [([], "batch"), (["--priority", "interactive"], "interactive")])
def test_sweep_priority_option_reaches_the_sweep_config(monkeypatch, tmp_path, extra, expected):
    import rmserve.pipelines.sweep as sweep_module

    seen = []

    def stop(config, *, tally):
        seen.append(config.priority)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "sweep", stop)
    result = runner.invoke(app, [*_sweep_args(tmp_path), "--quiet", *extra])
    assert result.exit_code == 130
    assert seen == [expected]


def test_priority_option_refuses_another_value(small_rmbench, tmp_path):
    result = runner.invoke(app, [
        "eval", "--server", "http://127.0.0.1:9", "--bench", "rm-bench", "--data", str(small_rmbench),
        "--out", str(tmp_path / "o"), "--priority", "urgent",
    ])
    assert result.exit_code == 2
    assert "'urgent' is not one of 'interactive', 'batch'" in " ".join(result.output.split())
