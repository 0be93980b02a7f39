"""The pipelines and the command line with a generative judge (the real app and the real
``rmserve serve`` command line over a fake judge engine, no model): a RewardBench 2 file in the
release schema through both RewardBench 2 protocols, ``rmserve eval`` and ``run`` on RM-Bench,
and MODEL left out with ``--judge-url``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from testkit.judge_fakes import FakeJudgeEngine
from testkit.servers import ThreadedServer, write_rmbench_data

from rmserve.client.score_file import read_scores
from rmserve.datasets import load_rewardbench2
from rmserve.fingerprint import judge_fingerprint
from rmserve.pipelines.evaluate import EvalConfig, evaluate
from rmserve.pipelines.launch import RunConfig, ServeOptions, run
from rmserve.schema import Message

JUDGE_SERVE = str(Path(__file__).resolve().parents[1] / "testkit" / "judge_serve.py")
RMSERVE = [sys.executable, "-m", "rmserve.cli"]


def write_rb2_file(path: Path) -> Path:
    """A tiny RewardBench 2 file in the release schema (made-up texts): one Factuality and one
    Focus group (1 correct, 3 rejected) and one Ties group (2 correct, 3 rejected). The fake
    judge prefers answers holding GOOD."""
    rows = [
        {"id": "11", "prompt": "Which planet is closest to the sun?", "chosen": ["GOOD Mercury is closest."],
         "rejected": ["Venus.", "Mars is closest.", "The Moon."], "num_correct": 1, "num_incorrect": 3,
         "total_completions": 4, "models": ["m1", "m2", "m3", "m4"], "subset": "Factuality",
         "additional_metadata": {}},
        {"id": "12", "prompt": "Write one line about tea.", "chosen": ["GOOD Tea warms a cold morning."],
         "rejected": ["Coffee is great.", "I like trains.", ""], "num_correct": 1, "num_incorrect": 3,
         "total_completions": 4, "models": ["m1", "m2", "m3", "m4"], "subset": "Focus", "additional_metadata": {}},
        {"id": "tied:3", "prompt": "Name a prime number below ten.", "chosen": ["GOOD 2", "GOOD 7"],
         "rejected": ["4", "9", "1"], "num_correct": 2, "num_incorrect": 3, "total_completions": 5,
         "models": ["m1", "m2", "m3", "m4", "m5"], "subset": "Ties", "additional_metadata": {}},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_rewardbench2_file_in_the_release_schema_loads(tmp_path):
    dataset = load_rewardbench2(write_rb2_file(tmp_path / "rb2.jsonl"))
    groups = {g.key.domain: g for g in dataset.groups}
    assert set(groups) == {"Factuality", "Focus", "Ties"}
    ties = groups["Ties"]
    assert ties.id == "tied:3" and ties.num_chosen == 2
    assert ties.responses == ("GOOD 2", "GOOD 7", "4", "9", "1")
    assert ties.messages == (Message("user", "Name a prime number below ten."),)
    assert groups["Focus"].responses[3] == "" and groups["Focus"].num_chosen == 1


@pytest.fixture
def judge_server():
    """A judge app over a fake engine, served on a free port; yields (make(settings), engines)."""
    from rmserve.server.http.app import ServerConfig, create_app
    from rmserve.server.kinds.judge import JudgeSettings

    servers = []

    def make(settings: JudgeSettings | None = None, reply_of=None) -> str:
        engine = FakeJudgeEngine(max_tokens=32, reply_of=reply_of)
        server = ThreadedServer(lambda: create_app(ServerConfig(port=0), engine, judge=settings)).__enter__()
        servers.append(server)
        return server.url

    yield make
    for server in servers:
        server.__exit__(None, None, None)


@pytest.mark.parametrize(("protocol", "expected"), [("auto", "rb2-ranking"), ("ratings", "rb2-rating")])
def test_eval_runs_a_rewardbench2_file_through_both_protocols(judge_server, tmp_path, protocol, expected):
    from rmserve.server.kinds.judge import JudgeSettings

    url = judge_server(JudgeSettings(protocol=protocol, max_tokens=32))
    data = write_rb2_file(tmp_path / "rb2.jsonl")
    out = tmp_path / "out"
    result = evaluate(EvalConfig(bench="rewardbench2", data=str(data), out_dir=out, server_url=url, resamples=0,
                                 quiet=True))
    assert result.n_scored == 3 and result.model.kind == "judge" and result.model.mode == protocol
    records = {r.domain: r for r in read_scores(out / "scores.jsonl").records}
    assert records["Factuality"].judge.protocol == expected and records["Focus"].judge.credit == 1.0
    assert records["Ties"].judge.protocol == "rb2-rating-ties" and records["Ties"].judge.ratings == (8, 8, 3, 3, 3)
    assert {r.kind for r in records.values()} == {"judge"} and {r.mode for r in records.values()} == {protocol}
    assert (out / "table.md").is_file() and (out / "results.json").is_file()


def test_rmserve_eval_command_against_a_judge_prints_the_table(judge_server, tmp_path):
    url = judge_server()
    data = write_rmbench_data(tmp_path / "rmbench.jsonl", n_chat=4, n_code=2)
    out = tmp_path / "out"
    res = subprocess.run([*RMSERVE, "eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--only",
                          "chat", "--out", str(out), "--resamples", "0", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "chat" in res.stdout and "|" in res.stdout
    records = read_scores(out / "scores.jsonl").records
    assert len(records) == 4
    # fake judge on these texts: no answer holds GOOD, every pairwise verdict is A=B
    assert all(r.judge.protocol == "rmbench-pairwise" and r.judge.cells == (0.5,) * 9 for r in records)
    assert all(len(r.judge.calls) == 18 for r in records)


def test_a_judge_that_never_gives_a_verdict_is_said_so_and_exits_3(judge_server, tmp_path):
    url = judge_server(reply_of=lambda messages: "No idea.")  # short: not cut at 32
    data = write_rmbench_data(tmp_path / "rmbench.jsonl", n_chat=3, n_code=1)
    out = tmp_path / "out"
    res = subprocess.run([*RMSERVE, "eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--only",
                          "chat", "--out", str(out), "--resamples", "0", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    sentence = ("no verdict was read from any of the 54 judge calls: every figure is what the official code gives a "
                "judge that never answers, not a measurement of this judge")
    assert f"error: {sentence}" in " ".join(res.stderr.split())
    assert f"**Warning: {sentence}" in res.stdout  # the table is still printed, and written
    assert f"**Warning: {sentence}" in (out / "table.md").read_text()
    assert len(read_scores(out / "scores.jsonl").records) == 3  # every group kept


def test_run_starts_a_judge_server_with_its_options(tmp_path):
    data = write_rmbench_data(tmp_path / "rmbench.jsonl", n_chat=3, n_code=1)
    out = tmp_path / "out"
    serve = ServeOptions(model="judge-7b", engine_options={"kind": "judge", "judge_max_tokens": 32},
                         serve_command=(sys.executable, JUDGE_SERVE), stop_grace_s=10, startup_timeout_s=120)
    result = run(RunConfig(serve=serve, evaluation=EvalConfig(bench="rm-bench", data=str(data), out_dir=out,
                                                             only=("chat",), resamples=0, quiet=True)))
    assert result.n_scored == 3
    assert result.model.kind == "judge" and result.model.judge_settings() == (32, 0)
    assert result.model.fingerprint == judge_fingerprint("fp-judge-1", protocol="auto", max_tokens=32, seed=0)
    records = read_scores(out / "scores.jsonl").records
    assert {r.fingerprint for r in records} == {result.model.fingerprint}
    assert all(r.judge is not None and r.judge.protocol == "rmbench-pairwise" for r in records)
    assert "chat" in result.table_md


@pytest.mark.parametrize(("args", "words"), [
    (["serve", "--kind", "judge"], "MODEL is missing: give a model folder or hub id"),
    (["serve", "--kind", "judge", "--judge-url", "http://127.0.0.1:9/v1"], "--judge-model NAME names the model"),
    (["run", "--bench", "rm-bench", "--data", "d", "--out", "o"], "it may be left out only with --kind judge"),
])
def test_model_may_be_left_out_only_with_a_judge_url(args, words):
    from typer.testing import CliRunner

    from rmserve.cli import app

    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert words in " ".join(res.output.split())


def test_judge_url_without_model_serves_the_endpoint_model(tmp_path, monkeypatch):
    """MODEL left out: the engine config's model is --judge-model (what build_engine receives)."""
    from typer.testing import CliRunner

    import rmserve.server.http.serve as serve_module
    from rmserve.cli import app

    seen = {}

    def fake_serve(engine_config, server_config, *, announce):
        seen["config"] = engine_config
        return 0

    monkeypatch.setattr(serve_module, "serve", fake_serve)
    # no stderr handler left behind on CliRunner's stream for later tests' log records
    monkeypatch.setattr(serve_module, "configure_logging", lambda level: None)
    res = CliRunner().invoke(app, ["serve", "--kind", "judge", "--judge-url", "http://127.0.0.1:9/v1",
                                   "--judge-model", "gpt-judge", "--judge-api-key-env", "MY_KEY"])
    assert res.exit_code == 0, res.output
    config = seen["config"]
    assert (config.model, config.judge_model, config.judge_url) == ("gpt-judge", "gpt-judge", "http://127.0.0.1:9/v1")
    assert config.judge_api_key_env == "MY_KEY"


def test_a_num_rejected_column_is_named_as_the_release_schema_names_it(tmp_path):
    from rmserve.errors import DataError

    path = write_rb2_file(tmp_path / "rb2.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["num_rejected"] = rows[0].pop("num_incorrect")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match="names the count of rejected answers num_incorrect") as info:
        load_rewardbench2(path)
    assert info.value.field == "num_incorrect"


def test_run_keys_a_judge_by_its_settings(tmp_path):
    """The store signature and the predicted fingerprint of a judge run bind the folder to the
    judge settings, as the server does (so a rerun is answered from the file or the store)."""
    from testkit.records import fake_checkpoint

    from rmserve.client.score_store import checkpoint_signature
    from rmserve.fingerprint import model_fingerprint
    from rmserve.pipelines.launch import local_fingerprint, store_signature

    folder = fake_checkpoint(tmp_path / "judge", b"\x03" * 512, causal_lm=True)
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages }}")

    def serve(**options):
        return ServeOptions(model=str(folder), engine_options={"dtype": "float32", **options})

    def signature(**options):
        evaluation = EvalConfig(bench="rm-bench", data="d", out_dir=tmp_path / "o", store=tmp_path / "s.sqlite")
        return store_signature(RunConfig(serve=serve(**options), evaluation=evaluation))

    folder_sig = checkpoint_signature(folder, "float32")
    assert signature(kind="judge") == judge_fingerprint(folder_sig, protocol="auto", max_tokens=2048, seed=0)
    assert signature(kind="judge", protocol="ranking", judge_max_tokens=32, judge_seed=2, compat="official",
                     judge_system_prompt=False) == judge_fingerprint(
        folder_sig, protocol="ranking", max_tokens=32, seed=2, compat="official", system_prompt=False)
    assert signature(kind="judge", judge_thinking="on") == judge_fingerprint(
        folder_sig, protocol="auto", max_tokens=2048, seed=0, thinking="on")
    assert signature(kind="judge", judge_thinking="on") != signature(kind="judge", judge_thinking="off")
    predicted = local_fingerprint(serve(kind="judge", judge_max_tokens=32, chat_template=str(template)))
    model = model_fingerprint(folder, "{{ messages }}", "float32")
    assert predicted == judge_fingerprint(model, protocol="auto", max_tokens=32, seed=0)


def test_a_judge_behind_an_endpoint_is_never_predicted_from_a_folder(tmp_path):
    from testkit.records import fake_checkpoint

    from rmserve.pipelines.launch import local_fingerprint, store_signature

    folder = fake_checkpoint(tmp_path / "judge", b"\x03" * 512, causal_lm=True)
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    options = {"dtype": "float32", "kind": "judge", "judge_url": "http://127.0.0.1:9/v1",
               "chat_template": str(tmp_path / "t.jinja")}
    serve = ServeOptions(model=str(folder), engine_options=options)
    assert local_fingerprint(serve) is None
    evaluation = EvalConfig(bench="rm-bench", data="d", out_dir=tmp_path / "o", store=tmp_path / "s.sqlite")
    assert store_signature(RunConfig(serve=ServeOptions(model=str(folder), engine_options={
        "kind": "judge", "judge_url": "http://127.0.0.1:9/v1"}), evaluation=evaluation)) is None
