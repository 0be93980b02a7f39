"""The score store as the pipelines use it: ``eval``, ``run`` and the CLI with ``--store`` (no
engine: the wire stub, or the real app over a fake engine, answers)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import msgspec
import pytest
from rmserve.client.score_file import read_scores
from rmserve.client.score_store import STORE_ENV, ScoreConflict, ScoreStore, checkpoint_signature
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.pipelines.launch import RunConfig, ServeOptions, run
from testkit.records import fake_checkpoint
from typer.testing import CliRunner

from rmserve import errors
from rmserve.cli import app

STUB_SCRIPT = str(Path(__file__).resolve().parents[1] / "testkit" / "wire_stub.py")
N_SMALL = 10  # groups in the small_rmbench fixture (6 chat + 4 code)


# --- eval with a store --------------------------------------------------------------------


def _config(stub_http, data, out_dir, store, **kwargs) -> EvalConfig:
    kwargs.setdefault("resamples", 0)
    kwargs.setdefault("quiet", True)
    return EvalConfig(
        bench="rm-bench", data=str(data), out_dir=out_dir, server_url=str(stub_http.make_url("")), store=store, **kwargs
    )


async def _eval(stub_http, config):
    return await evaluate_async(config, session=stub_http.session)


def _figures(out: Path) -> dict:
    results = json.loads((out / "results.json").read_text())
    results.pop("files")  # the score file's path
    return results


async def test_second_eval_is_answered_from_the_store(stub_http, stub_state, small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    first = await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "a", store))
    assert stub_state.score_requests == N_SMALL
    assert first.n_scored == N_SMALL
    second = await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "b", store))
    assert stub_state.score_requests == N_SMALL  # nothing sent
    assert (second.n_scored, second.n_resumed, second.n_from_store) == (0, 0, N_SMALL)
    assert f"answered from the store: {N_SMALL} groups ({store})" in second.notes
    assert _figures(tmp_path / "b") == _figures(tmp_path / "a")
    assert _figures(tmp_path / "a")["domains"]["chat"]["score"] == 1.0
    assert read_scores(tmp_path / "b" / "scores.jsonl").records == read_scores(tmp_path / "a" / "scores.jsonl").records


async def test_another_fingerprint_is_scored_again(stub_http, stub_state, small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "a", store))
    stub_state.model = msgspec.structs.replace(stub_state.model, name="rm-next", fingerprint="fp-next")
    result = await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "b", store))
    assert stub_state.score_requests == 2 * N_SMALL
    assert (result.n_scored, result.n_from_store) == (N_SMALL, 0)
    with sqlite3.connect(store) as conn:
        counts = conn.execute("SELECT fingerprint, model, COUNT(*) FROM scores GROUP BY fingerprint ORDER BY fingerprint")
        assert counts.fetchall() == [("fp-next", "rm-next", N_SMALL), ("fp-stub-1", "stub-rm", N_SMALL)]


async def test_only_the_groups_missing_from_the_store_are_sent(stub_http, stub_state, small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "a", store, only=("code",)))
    assert sorted(stub_state.received_ids) == [f"rm-bench/code/{i}" for i in range(4)]
    before = len(stub_state.received_ids)
    result = await _eval(stub_http, _config(stub_http, small_rmbench, tmp_path / "b", store))
    assert sorted(stub_state.received_ids[before:]) == [f"rm-bench/chat/{i}" for i in range(6)]
    assert (result.n_scored, result.n_from_store) == (6, 4)
    # The score file holds the data's groups in data order (chat 0-5, then code 0-3).
    ids = [str(r.key) for r in read_scores(tmp_path / "b" / "scores.jsonl").records]
    assert ids == [f"rm-bench/chat/{i}" for i in range(6)] + [f"rm-bench/code/{i}" for i in range(4)]


async def test_score_file_is_rewritten_with_exactly_the_data_groups(stub_http, stub_state, small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    out = tmp_path / "a"
    await _eval(stub_http, _config(stub_http, small_rmbench, out, store))
    result = await _eval(stub_http, _config(stub_http, small_rmbench, out, store, only=("code",)))
    assert stub_state.score_requests == N_SMALL
    assert result.n_resumed == 4
    assert [str(r.key) for r in read_scores(out / "scores.jsonl").records] == [f"rm-bench/code/{i}" for i in range(4)]
    with ScoreStore(store) as db:  # the chat groups left the file, not the store
        assert len(db.stored_keys("fp-stub-1")) == N_SMALL


async def test_a_score_file_from_a_run_without_store_fills_the_store(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "a"
    await _eval(stub_http, _config(stub_http, small_rmbench, out, None))
    store = tmp_path / "scores.sqlite"
    result = await _eval(stub_http, _config(stub_http, small_rmbench, out, store))
    assert stub_state.score_requests == N_SMALL
    assert f"added {N_SMALL} groups of {out / 'scores.jsonl'} to the score store {store}" in result.notes
    with ScoreStore(store) as db:
        assert db.records("fp-stub-1") == sorted(
            read_scores(out / "scores.jsonl").records, key=lambda r: (r.benchmark, r.domain, r.id)
        )


async def test_store_and_score_file_disagreeing_is_an_error(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "a"
    await _eval(stub_http, _config(stub_http, small_rmbench, out, None))
    store = tmp_path / "scores.sqlite"
    first = read_scores(out / "scores.jsonl").records[0]
    with ScoreStore(store) as db:
        db.put(msgspec.structs.replace(first, rewards=tuple(r + 1 for r in first.rewards)))
    with pytest.raises(ScoreConflict, match=str(first.key)):
        await _eval(stub_http, _config(stub_http, small_rmbench, out, store))


def test_no_store_by_default():
    assert EvalConfig(bench="rm-bench", data="d", out_dir=Path("o")).store is None


# --- run() with a store -------------------------------------------------------------------------


def _run_config(model: Path, data: Path, out: Path, store: Path | None, *serve_extra: str) -> RunConfig:
    serve = ServeOptions(model=str(model), serve_command=(sys.executable, STUB_SCRIPT, *serve_extra), stop_grace_s=5)
    evaluation = EvalConfig(bench="rm-bench", data=str(data), out_dir=out, resamples=0, quiet=True, store=store)
    return RunConfig(serve=serve, evaluation=evaluation)


@pytest.mark.model
def test_run_of_a_fully_stored_checkpoint_starts_no_server(small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    checkpoint = fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
    first = run(_run_config(checkpoint, small_rmbench, tmp_path / "a", store))
    assert (first.n_scored, first.model.fingerprint) == (N_SMALL, "fp-stub-1")
    assert (tmp_path / "a" / "server.log").is_file()
    # The server's dtype rule without --dtype: bfloat16 on CUDA, float32 otherwise.
    dtype = "bfloat16" if __import__("torch").cuda.is_available() else "float32"
    with ScoreStore(store) as db:
        assert db.fingerprint_for(checkpoint_signature(checkpoint, dtype)) == "fp-stub-1"
        assert db.fingerprint_for(checkpoint_signature(checkpoint)) is None  # the signature covers the dtype

    # A server started now would exit at once: the run must not need one.
    second = run(_run_config(checkpoint, small_rmbench, tmp_path / "b", store, "--fail-at-start"))
    assert not (tmp_path / "b" / "server.log").exists()
    assert any(n.startswith("answered from the store, no server started") for n in second.notes)
    assert (second.n_scored, second.n_from_store) == (0, N_SMALL)
    assert second.model == first.model
    assert _figures(tmp_path / "b") == _figures(tmp_path / "a")
    assert read_scores(tmp_path / "b" / "scores.jsonl").records == read_scores(tmp_path / "a" / "scores.jsonl").records


def test_run_of_changed_weights_starts_a_server(small_rmbench, tmp_path):
    store = tmp_path / "scores.sqlite"
    checkpoint = fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
    run(_run_config(checkpoint, small_rmbench, tmp_path / "a", store))
    (checkpoint / "model.safetensors").write_bytes(b"\x08" * 1024)
    with pytest.raises(errors.ServerFault, match="exited with status 3 before it was ready"):
        run(_run_config(checkpoint, small_rmbench, tmp_path / "b", store, "--fail-at-start"))
    assert (tmp_path / "b" / "server.log").is_file()


def test_run_without_store_remembers_nothing(small_rmbench, tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
    run(_run_config(checkpoint, small_rmbench, tmp_path / "a", None))
    assert not (tmp_path / "scores.sqlite").exists()
    assert list(tmp_path.glob("**/*.sqlite")) == []


# --- the CLI ------------------------------------------------------------------------------------

runner = CliRunner()


def _cli_eval(url, data, out, *extra, quiet: bool = True):
    args = ["eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--out", str(out),
            "--resamples", "0", *(["--quiet"] if quiet else []), *extra]
    return runner.invoke(app, args)


def test_cli_store_comes_from_the_option_or_the_environment(scoring_server, small_rmbench, tmp_path, monkeypatch):
    # (The server's result cache answers repeated groups without the engine, so what is
    # sent is read from the notes: every group answered from the store means none was sent.)
    url, _ = scoring_server
    env_store = tmp_path / "env.sqlite"
    monkeypatch.setenv(STORE_ENV, str(env_store))
    result = _cli_eval(url, small_rmbench, tmp_path / "a", "--no-store")
    assert result.exit_code == 0, result.output
    assert not env_store.exists()
    result = _cli_eval(url, small_rmbench, tmp_path / "b")
    assert result.exit_code == 0, result.output
    with ScoreStore(env_store) as db:
        assert len(db.stored_keys("fp-fake-1")) == N_SMALL
    result = _cli_eval(url, small_rmbench, tmp_path / "c", quiet=False)
    assert result.exit_code == 0, result.output
    assert f"answered from the store: {N_SMALL} groups" in result.stderr
    assert f"0 groups sent now, 0 resumed, {N_SMALL} from the store" in result.stderr

    explicit = tmp_path / "explicit.sqlite"
    result = _cli_eval(url, small_rmbench, tmp_path / "d", "--store", str(explicit))
    assert result.exit_code == 0, result.output
    with ScoreStore(explicit) as db:
        assert len(db.stored_keys("fp-fake-1")) == N_SMALL


def test_cli_store_and_no_store_exclude_each_other(small_rmbench, tmp_path):
    result = _cli_eval("http://127.0.0.1:9", small_rmbench, tmp_path / "a", "--store", str(tmp_path / "s"), "--no-store")
    assert result.exit_code == 2
    assert "--store and --no-store exclude each other" in " ".join(result.output.split())


def test_cli_bad_store_is_one_line_exit_1(scoring_server, small_rmbench, tmp_path, monkeypatch):
    url, _ = scoring_server
    store = tmp_path / "s.sqlite"
    store.write_bytes(b"not sqlite at all" * 100)
    result = _cli_eval(url, small_rmbench, tmp_path / "a", "--store", str(store))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: data_error:") and "not a usable SQLite score store" in result.stderr
