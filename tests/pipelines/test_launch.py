"""The launcher: a child server process (the wire stub as a script), readiness, stopping, run()."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from rmserve.pipelines import launch
from rmserve.pipelines.evaluate import EvalConfig
from rmserve.pipelines.launch import (
    RunConfig,
    ServeOptions,
    ServerProcess,
    free_loopback_port,
    local_fingerprint,
    log_tail,
    run,
)

from rmserve import errors
from rmserve.fingerprint import dpo_fingerprint, model_fingerprint
from rmserve.schema import ScoreRecord
from testkit.processes import parent_killed, wait_exited
from testkit.records import fake_checkpoint

STUB_SCRIPT = str(Path(__file__).resolve().parents[1] / "testkit" / "wire_stub.py")


def _server(tmp_path, *extra, startup_timeout_s=30.0, stop_grace_s=5.0) -> ServerProcess:
    port = free_loopback_port()
    argv = [sys.executable, STUB_SCRIPT, "--port", str(port), *extra]
    return ServerProcess(
        argv,
        url=f"http://127.0.0.1:{port}",
        log_path=tmp_path / "server.log",
        startup_timeout_s=startup_timeout_s,
        stop_grace_s=stop_grace_s,
    )


def _refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_serve_options_build_the_serve_command_line():
    options = ServeOptions(
        model="org/rm",
        engine_options={"enforce_eager": True, "block_size": 16, "engine": "hf", "dtype": "float32",
                        "max_model_len": 4096, "enable_prefix_caching": False},
        extra_args=("--max-inflight-groups", "64"),
    )
    # Declaration order (EngineConfig's field order), not the mapping's; False → --no-…
    assert options.argv("127.0.0.1", 5123) == [
        sys.executable, "-m", "rmserve.cli", "serve", "org/rm", "--host", "127.0.0.1", "--port", "5123",
        "--engine", "hf", "--dtype", "float32", "--max-model-len", "4096", "--block-size", "16",
        "--enforce-eager", "--no-enable-prefix-caching", "--parent-pid", str(os.getpid()),
        "--max-inflight-groups", "64",
    ]
    assert ServeOptions(model="m", watch_parent=False).argv("127.0.0.1", 1)[4:] == [
        "m", "--host", "127.0.0.1", "--port", "1",
    ]


@pytest.mark.parametrize(
    ("engine_options", "words"),
    [
        ({"max_num_seq": 4}, "'max_num_seq' not among"),
        ({"block_size": 24}, "block_size: 24 must be a power of 2 between 8 and 256"),
        ({"enforce_eager": "yes"}, "enforce_eager: 'yes' must be true or false"),
        ({"dtype": "fp8"}, "dtype: 'fp8' is not one of auto, float32, bfloat16, float16"),
    ],
)
def test_serve_options_refuse_bad_engine_options(engine_options, words):
    with pytest.raises(ValueError) as info:
        ServeOptions(model="m", engine_options=engine_options)
    assert words in str(info.value)


def test_serve_options_engine_options_cannot_change_afterwards():
    source = {"dtype": "float32"}
    options = ServeOptions(model="m", engine_options=source)
    source["dtype"] = "bfloat16"
    assert options.engine_options == {"dtype": "float32"}
    with pytest.raises(TypeError):
        options.engine_options["dtype"] = "bfloat16"  # type: ignore[index]


def test_run_config_refuses_a_server_url(tmp_path):
    with pytest.raises(ValueError, match="starts its own server"):
        RunConfig(ServeOptions(model="m"), EvalConfig(bench="rm-bench", data="d", out_dir=tmp_path, server_url="http://h:1"))


def test_child_server_becomes_ready_and_stops_on_sigterm(tmp_path):
    server = _server(tmp_path)
    port = int(server.url.rsplit(":", 1)[1])
    with server:
        server.wait_ready()
        assert server.returncode is None
    assert server.returncode is not None and server.returncode != -signal.SIGKILL
    assert _refuses_connections(port)
    log = (tmp_path / "server.log").read_text()
    assert "starting:" in log and f"stub: serving on 127.0.0.1:{port}" in log


def test_the_servers_own_warnings_are_printed_once_ready(tmp_path, capsys):
    with _server(tmp_path, "--warn", "running the modeling code of 'x'") as first:
        first.wait_ready()
    with _server(tmp_path, "--warn", "POST /get_reward will refuse every query") as second:  # same log, appended
        second.wait_ready()
        assert second.start_warnings() == ["POST /get_reward will refuse every query"]  # this start's part only
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("server warning: ")] == [
        "server warning: running the modeling code of 'x'",
        "server warning: POST /get_reward will refuse every query",
    ]


def test_an_engine_refusal_is_said_in_one_line_without_the_traceback(tmp_path):
    with _server(tmp_path, "--refuse-at-start", "judge_system_prompt: refused; start it with --x") as server:
        with pytest.raises(errors.StartRefused) as info:
            server.wait_ready()
    assert info.value.message == (
        f"the server refused to start: judge_system_prompt: refused; start it with --x (the whole log: "
        f"{tmp_path / 'server.log'})")
    assert info.value.quoted == ()


def test_child_that_dies_early_fails_with_the_log_tail(tmp_path):
    with _server(tmp_path, "--fail-at-start") as server:
        with pytest.raises(errors.ServerFault, match="exited with status 3 before it was ready") as info:
            server.wait_ready()
    assert "cannot load the model (scripted)" in str(info.value)


CHILD_USAGE_ERROR = (
    "import sys; print('Usage: rmserve serve [OPTIONS] [MODEL]'); print('Try rmserve serve --help for help.'); "
    "print(); print(\"Error: Invalid value for 'MODEL': checkpoint 'x/config.json': is missing\"); sys.exit(2)"
)


def test_a_child_s_log_lines_are_printed_as_lines_not_folded_into_the_error_line(tmp_path, capsys):
    import typer

    from rmserve.cli_common import guarded

    log = tmp_path / "server.log"
    server = ServerProcess([sys.executable, "-c", CHILD_USAGE_ERROR], url=f"http://127.0.0.1:{free_loopback_port()}",
                           log_path=log, startup_timeout_s=30, stop_grace_s=5, quiet=True)
    with server, pytest.raises(errors.StartRefused) as info:  # status 2: the child refused what it was given
        server.wait_ready()
    exc = info.value
    said = ("the server refused to start (exit status 2: the model, an option or the port was refused); "
            f"last lines of {log}:")
    assert exc.message == said
    assert exc.quoted[-4:] == (
        "Usage: rmserve serve [OPTIONS] [MODEL]",
        "Try rmserve serve --help for help.",
        "",
        "Error: Invalid value for 'MODEL': checkpoint 'x/config.json': is missing",
    )
    assert exc.quoted[1].startswith("=== rmserve: ")  # the launcher's header line, then the child's output
    assert str(exc) == "\n".join((exc.message, *exc.quoted))

    def fail():
        raise exc

    with pytest.raises(typer.Exit) as stopped:
        guarded(fail)
    assert stopped.value.exit_code == 2  # bad input, as the child's own usage error
    assert capsys.readouterr().err.splitlines() == [
        f"error: start_refused: {said}",
        *exc.quoted,
    ]


def test_child_not_ready_in_time_fails_with_the_log_tail(tmp_path):
    with _server(tmp_path, "--startup-delay-s", "30", startup_timeout_s=0.5) as server:
        with pytest.raises(errors.EngineNotReady, match="not ready after 0.5 s") as info:
            server.wait_ready()
    assert "server.log" in str(info.value)
    assert server.returncode is not None  # stopped on the way out


def test_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    server = _server(tmp_path, "--ignore-sigterm", stop_grace_s=0.5)
    with server:
        server.wait_ready()
    assert server.returncode == -signal.SIGKILL


def test_log_tail_keeps_the_last_lines(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(path, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing") == ""


def test_run_starts_evaluates_and_stops_the_server(small_rmbench, tmp_path):
    out = tmp_path / "out"
    serve = ServeOptions(
        model="stub-model", engine_options={"dtype": "float32"}, serve_command=(sys.executable, STUB_SCRIPT), stop_grace_s=5
    )
    evaluation = EvalConfig(bench="rm-bench", data=str(small_rmbench), out_dir=out, resamples=0, quiet=True)
    result = run(RunConfig(serve=serve, evaluation=evaluation))
    assert (result.n_scored, result.model.name) == (10, "stub-rm")
    assert json.loads((out / "results.json").read_text())["domains"]["chat"]["score"] == 1.0
    log = (out / "server.log").read_text()
    # The engine options reached the child; it served on the port the launcher picked.
    assert f"stub server argv extras: ['stub-model', '--dtype', 'float32', '--parent-pid', '{os.getpid()}']" in log
    port = int(re.search(r"stub: serving on 127\.0\.0\.1:(\d+)", log).group(1))
    assert _refuses_connections(port)  # stopped after the evaluation


_LAUNCHING_PARENT = """
import sys, time
from pathlib import Path
from rmserve.pipelines.launch import ServerProcess, free_loopback_port

stub, log = sys.argv[1], Path(sys.argv[2])
port = free_loopback_port()
server = ServerProcess([sys.executable, stub, "--port", str(port)], url=f"http://127.0.0.1:{port}",
                       log_path=log, startup_timeout_s=60, stop_grace_s=5)
server.start()
server.wait_ready()
print(server.process.pid, port, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc are Linux")
def test_child_server_stops_when_its_launcher_is_sigkilled(tmp_path):
    argv = [sys.executable, "-c", _LAUNCHING_PARENT, STUB_SCRIPT, str(tmp_path / "server.log")]
    with parent_killed(argv) as (child_pid, (port,)):  # SIGKILL: no cleanup runs in the launcher
        assert wait_exited(child_pid, 30.0), f"the server {child_pid} still runs 30 s after its launcher was killed"
        assert _refuses_connections(int(port))


# --- what the user sees while the server starts ------------------------------------------


def test_waiting_for_the_child_shows_a_status_line_then_ready_after(tmp_path, capsys):
    server = _server(tmp_path, "--startup-delay-s", "1.5")
    server.name = "demo-rm"
    with server:
        server.wait_ready()
    lines = capsys.readouterr().err.splitlines()
    # Not a terminal: the line when the wait starts (refused: the child does not listen yet),
    # no repeat within 15 s, then the end.
    what = f"starting server for demo-rm (log: {tmp_path / 'server.log'})…"
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{what} 0 s (not listening yet)")
    assert server.ready_after_s is not None and 1.5 <= server.ready_after_s < 20
    assert lines[1] == f"{what} ready after {round(server.ready_after_s)} s"


def test_quiet_child_wait_prints_nothing(tmp_path, capsys):
    server = _server(tmp_path, "--startup-delay-s", "0.5")
    server.quiet = True
    with server:
        server.wait_ready()
    assert capsys.readouterr().err == ""


def test_child_that_dies_while_starting_names_its_log(tmp_path, capsys):
    with _server(tmp_path, "--fail-at-start") as server:
        with pytest.raises(errors.ServerFault, match="exited with status 3 before it was ready") as info:
            server.wait_ready()
    assert f"last lines of {tmp_path / 'server.log'}" in str(info.value)
    assert "stub: cannot load the model (scripted)" in str(info.value)


# --- a finished run is answered from its score file ---------------------------------------

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def _checkpoint(tmp_path, *, causal_lm: bool = False) -> Path:
    folder = fake_checkpoint(tmp_path / "ckpt", b"weights-1", causal_lm=causal_lm)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return folder


def _finished_scores(out: Path, data: Path, fingerprint: str, *, skip: int = 0) -> None:
    """A score file holding every group of ``data`` (but the first ``skip``) under ``fingerprint``."""
    from rmserve.datasets import load_benchmark

    groups = load_benchmark("rm-bench", str(data)).groups
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.jsonl", "wb") as fh:
        for i, group in enumerate(groups[skip:]):
            n = len(group.responses)
            record = ScoreRecord(
                benchmark="rm-bench", domain=group.domain, id=group.id, num_chosen=group.num_chosen,
                rewards=tuple(float(n - k + i % 2) for k in range(n)), model="rm-local", fingerprint=fingerprint,
            )
            fh.write(msgspec.json.encode(record) + b"\n")


class _LauncherCalled(Exception):
    pass


@pytest.fixture
def no_launcher(monkeypatch):
    """Fails the test if run() starts a server."""

    def refuse(*args, **kwargs):
        raise _LauncherCalled("run() started a server")

    monkeypatch.setattr(launch, "ServerProcess", refuse)


def _run_config(model: Path, data: Path, out: Path, **engine) -> RunConfig:
    serve = ServeOptions(model=str(model), engine_options={"dtype": "float32", **engine})
    return RunConfig(serve=serve, evaluation=EvalConfig(bench="rm-bench", data=str(data), out_dir=out, resamples=0, quiet=True))


def test_local_fingerprint_is_the_server_rule_with_the_tokenizer_template(tmp_path):
    folder = _checkpoint(tmp_path)
    expected = model_fingerprint(folder, TEMPLATE, "float32")
    assert local_fingerprint(ServeOptions(model=str(folder), engine_options={"dtype": "float32"})) == expected
    # chat_template.jinja wins over tokenizer_config.json, as transformers loads it.
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert local_fingerprint(ServeOptions(model=str(folder), engine_options={"dtype": "float32"})) == model_fingerprint(
        folder, "{{ messages }}", "float32"
    )
    override = tmp_path / "t.jinja"
    override.write_text("override")
    with_override = ServeOptions(model=str(folder), engine_options={"dtype": "bfloat16", "chat_template": override})
    assert local_fingerprint(with_override) == model_fingerprint(folder, "override", "bfloat16")
    # Not computable here: a hub id, a template passed as a raw argument, no template at all.
    assert local_fingerprint(ServeOptions(model="org/rm", engine_options={"dtype": "float32"})) is None
    assert local_fingerprint(
        ServeOptions(model=str(folder), engine_options={"dtype": "float32"}, extra_args=("--chat-template", str(override)))
    ) is None
    bare = fake_checkpoint(tmp_path / "bare", b"w")
    assert local_fingerprint(ServeOptions(model=str(bare), engine_options={"dtype": "float32"})) is None


def test_local_fingerprint_covers_the_head_the_server_would_serve(tmp_path):
    from rmserve.schema import RewardHead

    folder = _checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_labels": 3}))
    options = {"dtype": "float32", "label_index": 2}
    expected = model_fingerprint(folder, TEMPLATE, "float32", RewardHead("multi-label", label_index=2))
    assert expected != model_fingerprint(folder, TEMPLATE, "float32")
    assert local_fingerprint(ServeOptions(model=str(folder), engine_options=options)) == expected
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForRewardModel"], "num_labels": 1}))
    assert local_fingerprint(ServeOptions(model=str(folder), engine_options={"dtype": "float32"})) == model_fingerprint(
        folder, TEMPLATE, "float32", RewardHead("token-value"))


def test_local_fingerprint_of_a_dpo_pair(tmp_path):
    policy, reference = _checkpoint(tmp_path, causal_lm=True), fake_checkpoint(tmp_path / "ref", b"ref", causal_lm=True)
    options = {"dtype": "float32", "kind": "dpo", "ref_model": str(reference)}
    expected = dpo_fingerprint(
        model_fingerprint(policy, TEMPLATE, "float32"), model_fingerprint(reference, TEMPLATE, "float32"), "reference"
    )
    assert local_fingerprint(ServeOptions(model=str(policy), engine_options=options)) == expected
    free = {"dtype": "float32", "kind": "dpo", "ref_free": "avg", "compat": "official"}
    assert local_fingerprint(ServeOptions(model=str(policy), engine_options=free)) == dpo_fingerprint(
        model_fingerprint(policy, TEMPLATE, "float32"), None, "avg", "official"
    )
    hub_ref = {"dtype": "float32", "kind": "dpo", "ref_model": "org/ref"}
    assert local_fingerprint(ServeOptions(model=str(policy), engine_options=hub_ref)) is None


def test_finished_run_is_answered_from_its_score_file_without_a_server(no_launcher, small_rmbench, tmp_path):
    folder = _checkpoint(tmp_path)
    out = tmp_path / "out"
    fingerprint = model_fingerprint(folder, TEMPLATE, "float32")
    _finished_scores(out, small_rmbench, fingerprint)
    before = (out / "scores.jsonl").read_bytes()
    result = run(_run_config(folder, small_rmbench, out))
    assert (result.n_scored, result.n_resumed, result.n_groups) == (0, 10, 10)
    assert (result.model.name, result.model.fingerprint, result.model.dtype) == ("rm-local", fingerprint, "float32")
    assert any("already holds every group" in n and "no server started" in n for n in result.notes)
    assert (out / "scores.jsonl").read_bytes() == before
    assert json.loads((out / "results.json").read_text())["n_groups"] == 10
    assert not (out / "server.log").exists()


@pytest.mark.parametrize("case", ["one group missing", "another fingerprint", "other dtype", "no score file"])
def test_unfinished_or_other_run_starts_the_server(no_launcher, small_rmbench, tmp_path, case):
    folder = _checkpoint(tmp_path)
    out = tmp_path / "out"
    fingerprint = model_fingerprint(folder, TEMPLATE, "float32")
    if case == "one group missing":
        _finished_scores(out, small_rmbench, fingerprint, skip=1)
    elif case == "another fingerprint":
        _finished_scores(out, small_rmbench, "fp-other")
    elif case == "other dtype":
        _finished_scores(out, small_rmbench, model_fingerprint(folder, TEMPLATE, "bfloat16"))
    with pytest.raises(_LauncherCalled):
        run(_run_config(folder, small_rmbench, out))
    assert (out / "scores.jsonl").exists() == (case != "no score file")


@pytest.mark.model
def test_local_fingerprint_of_the_demo_model_is_the_one_its_server_reports(demo_model_dir):
    from rmserve.server.render.chat import Renderer

    # What an engine hashes (EngineLifecycle._model_info): the renderer's template, the dtype.
    renderer = Renderer.from_pretrained(demo_model_dir, max_model_len=64)
    served = model_fingerprint(demo_model_dir, renderer.chat_template, "float32")
    assert local_fingerprint(ServeOptions(model=str(demo_model_dir), engine_options={"dtype": "float32"})) == served


# A parent that starts a child in its own process group, both recording the SIGTERMs they get;
# the parent waits (up to 2 s) for its child to exit on its own terms before it exits itself.
_FAMILY = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
if sys.argv[2] == "child":
    signal.signal(signal.SIGTERM, lambda *_: open(out + "/child-got-sigterm", "w").close())
    open(out + "/child-ready", "w").close()
    while True:
        time.sleep(0.05)
child = subprocess.Popen([sys.executable, "-c", sys.argv[3], out, "child", sys.argv[3]])
def stop(*_):
    open(out + "/parent-got-sigterm", "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while not os.path.exists(out + "/child-ready"):
    time.sleep(0.05)
open(out + "/child-pid", "w").write(str(child.pid))
while True:
    time.sleep(0.05)
"""


def test_stop_sends_sigterm_to_the_server_alone_and_kills_its_leftovers(tmp_path):
    """The server shuts its own engine processes down; a SIGTERM to the whole group would reach
    them first (vLLM then logs EngineDeadError and leaks shared memory)."""
    server = ServerProcess([sys.executable, "-c", _FAMILY, str(tmp_path), "parent", _FAMILY], url="http://127.0.0.1:1",
                           log_path=tmp_path / "family.log", startup_timeout_s=30, stop_grace_s=10)
    with server:  # stops the family on the way out whatever happens
        pid_file = tmp_path / "child-pid"
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:  # a deadlock guard, not a timing assert
            time.sleep(0.05)
        child_pid = int(pid_file.read_text())
        assert server.stop() == 0
    assert (tmp_path / "parent-got-sigterm").exists()
    assert not (tmp_path / "child-got-sigterm").exists()
    assert wait_exited(child_pid, 10)  # SIGKILLed with the group once the server had exited


def test_an_eval_stopped_by_sigterm_exits_143_and_says_where_to_resume(tmp_path, rmbench_dir):
    out = tmp_path / "run"
    with _server(tmp_path, "--delay-s", "0.3") as server:
        server.wait_ready()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rmserve.cli", "eval", "--server", server.url, "--bench", "rm-bench",
             "--data", str(rmbench_dir / "chat_filtered.json"), "--out", str(out), "--max-inflight-groups", "1",
             "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        scores = out / "scores.jsonl"
        deadline = time.monotonic() + 60
        while not (scores.exists() and scores.read_bytes().count(b"\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    kept = scores.read_bytes().count(b"\n")
    assert 2 <= kept < 129  # stopped mid-run, every line written so far kept whole
    assert err.rstrip().endswith(f"terminated (SIGTERM); scored groups are kept in {scores}; run again to resume")
    assert "Traceback" not in err and "never retrieved" not in err, err  # the loop unwound cleanly


def test_config_context_limit_reads_the_folder_s_max_position_embeddings(tmp_path):
    import json

    from rmserve.pipelines.launch import config_context_limit

    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 8192}}))
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text(json.dumps({"n_layer": 2}))
    assert config_context_limit(str(tmp_path / "plain")) == 4096
    assert config_context_limit(str(tmp_path / "vision")) == 8192
    assert config_context_limit(str(tmp_path / "none")) is None
    assert config_context_limit(str(tmp_path / "missing")) is None
    assert config_context_limit("org/model-on-the-hub") is None
