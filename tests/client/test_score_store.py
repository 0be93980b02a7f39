"""The score store (SQLite): records, batching, duplicates, crash safety, export, checkpoints,
and its use by ``evaluate`` / ``run`` / the CLI (no engine: the wire stub answers)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.pipelines.launch import RunConfig, ServeOptions, run
from rmserve.client.score_store import (
    SCHEMA_VERSION,
    STORE_ENV,
    ScoreConflict,
    ScoreStore,
    StoreVersionError,
    checkpoint_signature,
    default_store_path,
)
from rmserve.client.score_file import read_scores
from typer.testing import CliRunner

from rmserve import errors
from rmserve.cli import app
from rmserve.schema import GroupKey, ModelInfo, ScoreRecord

STUB_SCRIPT = str(Path(__file__).resolve().parents[1] / "testkit" / "wire_stub.py")
N_SMALL = 10  # groups in the small_rmbench fixture (6 chat + 4 code)


def _record(i: int, *, fingerprint: str = "fp-a", domain: str = "chat", rewards=None, **extra) -> ScoreRecord:
    return ScoreRecord(
        benchmark="rm-bench",
        domain=domain,
        id=str(i),
        num_chosen=1,
        rewards=rewards if rewards is not None else (i + 0.5, -i - 0.25),
        num_tokens=(10 + i, 20 + i),
        num_cached_tokens=(i, 0),
        model="rm-a",
        fingerprint=fingerprint,
        **extra,
    )


def _count(path: Path) -> int:
    """Rows committed to the store, read through a separate plain sqlite3 connection."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]


# --- the store on its own ---------------------------------------------------------------------


def test_records_round_trip_with_missing_rewards_and_optional_fields(tmp_path):
    full = _record(
        3,
        rewards=(1.25, None, -0.5),
        truncated_tokens=(0, 4, 0),
        styles=("concise", "detailed_plain", "detailed_markdown"),
        errors=(None, "sequence_too_long", None),
    )
    plain = _record(1, domain="code")
    other_model = _record(1, fingerprint="fp-b")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        for record in (full, plain, other_model):
            db.put(record, server_version="0.1.0")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        got = db.records("fp-a")
        # Sorted by (benchmark, domain, id): chat before code.
        assert got == [full, plain]
        assert got[0].rewards == (1.25, None, -0.5)
        assert db.records("fp-b") == [other_model]
        assert db.records("fp-a", keys=[GroupKey("rm-bench", "code", "1")]) == [plain]
        assert db.records("fp-a", benchmark="rewardbench2") == []
        assert db.stored_keys("fp-a") == {GroupKey("rm-bench", "chat", "3"), GroupKey("rm-bench", "code", "1")}
        assert db.stored_keys("fp-a", "rewardbench2") == frozenset()
        assert db.fingerprints() == [("fp-a", "rm-a", 2), ("fp-b", "rm-a", 1)]
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        row = conn.execute(
            "SELECT model, rewards, num_tokens, num_cached_tokens, server_version FROM scores "
            "WHERE fingerprint='fp-a' AND domain='chat' AND group_id='3'"
        ).fetchone()
    assert row == ("rm-a", "[1.25,null,-0.5]", "[13,23]", "[3,0]", "0.1.0")


def test_puts_commit_in_batches_and_flush_commits_the_rest(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScoreStore(path, batch_size=4, flush_interval_s=3600) as db:
        for i in range(3):
            db.put(_record(i))
        assert _count(path) == 0
        with ScoreStore(path) as second:  # another connection: sees only committed rows
            assert second.stored_keys("fp-a") == frozenset()
        db.put(_record(3))  # the fourth record fills the batch
        assert _count(path) == 4
        db.put(_record(4))
        db.put(_record(5))
        assert _count(path) == 4
        db.flush()
        assert _count(path) == 6
        db.put(_record(6))
    assert _count(path) == 7  # leaving the block commits the buffer


def test_a_waiting_buffer_is_committed_after_flush_interval(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScoreStore(path, batch_size=1000, flush_interval_s=0.05) as db:
        db.put(_record(0))
        db.put(_record(1))
        deadline = time.monotonic() + 30
        while _count(path) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _count(path) == 2  # committed by the store's thread, no further put or flush


def test_reads_include_this_objects_buffered_records(tmp_path):
    with ScoreStore(tmp_path / "s.sqlite", batch_size=100, flush_interval_s=3600) as db:
        db.put(_record(0))
        assert db.stored_keys("fp-a") == {GroupKey("rm-bench", "chat", "0")}


def test_identical_duplicate_is_ignored_and_a_conflicting_one_raises_naming_the_key(tmp_path):
    path = tmp_path / "s.sqlite"
    first = _record(1)
    with ScoreStore(path, batch_size=100, flush_interval_s=3600) as db:
        db.put(first)
        # Same rewards, other token counts: ignored, the first record stays.
        db.put(msgspec.structs.replace(first, num_cached_tokens=(9, 9)))
        with pytest.raises(ScoreConflict, match=r"'rm-bench/chat/1' \(fingerprint 'fp-a'\)") as buffered:
            db.put(msgspec.structs.replace(first, rewards=(1.5, -1.0)))
        assert isinstance(buffered.value, ValueError)
        db.flush()
        db.put(first)  # against the committed row now
        with pytest.raises(ValueError, match="rm-bench/chat/1"):
            db.put(msgspec.structs.replace(first, rewards=(0.0, 0.0)))
        assert db.records("fp-a") == [first]
        # The same group under another fingerprint is another key.
        db.put(msgspec.structs.replace(first, fingerprint="fp-b", rewards=(0.0, 0.0)))
    assert _count(path) == 2


def test_conflict_found_at_commit_keeps_the_other_records(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScoreStore(path, batch_size=100, flush_interval_s=3600) as db, ScoreStore(path) as other:
        db.put(_record(1))
        db.put(_record(2))
        other.put(_record(1, rewards=(7.0, 7.0)))  # another writer stores group 1 first
        other.flush()
        with pytest.raises(ScoreConflict, match="rm-bench/chat/1"):
            db.flush()
        assert [r.rewards for r in db.records("fp-a")] == [(7.0, 7.0), _record(2).rewards]


def test_record_without_fingerprint_is_refused(tmp_path):
    with ScoreStore(tmp_path / "s.sqlite") as db, pytest.raises(ValueError, match="'fingerprint'"):
        db.put(_record(0, fingerprint=""))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"batch_size": 0}, "batch_size must be an integer ≥ 1"), ({"flush_interval_s": 0}, "flush_interval_s must be")],
)
def test_bad_settings_are_refused(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        ScoreStore(tmp_path / "s.sqlite", **kwargs)


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    from rmserve.client.score_store import ScoreStore
    from rmserve.schema import ScoreRecord

    path = sys.argv[1]
    db = ScoreStore(path, batch_size=50, flush_interval_s=3600)
    for i in range(200):
        db.put(ScoreRecord("rm-bench", "chat", str(i), 1, (float(i), None), (1, 2), (0, 0), "rm", "fp-kill"))
        if i == 174:  # three batches committed, 25 records buffered
            with sqlite3.connect(path) as conn:
                assert conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0] == 150
            os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sigkill_loses_only_the_uncommitted_buffer(tmp_path):
    path = tmp_path / "s.sqlite"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with ScoreStore(path) as db:
        records = db.records("fp-kill")
    assert sorted(int(r.id) for r in records) == list(range(150))
    assert all(r.rewards == (float(r.id), None) for r in records)


def test_export_jsonl_reads_back_as_the_records_in_key_order(tmp_path):
    records = [_record(i, rewards=(i * 0.1, None) if i % 2 else None, styles=("a", "b")) for i in range(5)]
    out = tmp_path / "run" / "scores.jsonl"
    with ScoreStore(tmp_path / "s.sqlite") as db:
        for record in records:
            db.put(record)
        assert db.export_jsonl(out, "fp-a") == 5
        assert read_scores(out).records == tuple(records)
        order = [records[3].key, records[0].key, GroupKey("rm-bench", "chat", "99"), records[4].key]
        assert db.export_jsonl(out, "fp-a", keys=order) == 3  # the unknown key is not stored
        assert read_scores(out).records == (records[3], records[0], records[4])
        assert db.export_jsonl(out, "fp-other") == 0
        assert out.read_bytes() == b""
    assert [p.name for p in out.parent.iterdir()] == ["scores.jsonl"]  # no temporary file left


def test_default_store_path_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(STORE_ENV, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local" / "share" / "rmserve" / "scores.sqlite"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "rmserve" / "scores.sqlite"
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "mine.sqlite"))
    assert default_store_path() == tmp_path / "mine.sqlite"


def _fake_checkpoint(path: Path, weights: bytes) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}')
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path


def test_checkpoint_signature_follows_the_weights(tmp_path):
    from rmserve.fingerprint import model_fingerprint

    a = _fake_checkpoint(tmp_path / "step-1", b"\x00" * 4096)
    b = _fake_checkpoint(tmp_path / "step-2", b"\x00" * 4095 + b"\x01")
    a_copy = _fake_checkpoint(tmp_path / "elsewhere" / "step-1", b"\x00" * 4096)
    assert checkpoint_signature(a) != checkpoint_signature(b)
    assert checkpoint_signature(a) == checkpoint_signature(a_copy)  # content, not place
    assert checkpoint_signature(a) == model_fingerprint(a, chat_template=None)
    with pytest.raises(ValueError, match="not a folder"):
        checkpoint_signature(tmp_path / "missing")


def test_remember_checkpoint_round_trip(tmp_path):
    info = ModelInfo(name="rm-a", max_model_len=4096, dtype="float32", fingerprint="fp-a", engine="vllm")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        assert db.fingerprint_for("sig-1") is None
        db.remember_checkpoint("sig-1", path="/ckpt/1", fingerprint="fp-a", model="rm-a", info=info)
        db.remember_checkpoint("sig-2", path="/ckpt/2", fingerprint="fp-b", model="rm-b")
    with ScoreStore(tmp_path / "s.sqlite") as db:
        assert (db.fingerprint_for("sig-1"), db.fingerprint_for("sig-2")) == ("fp-a", "fp-b")
        assert db.model_info_for("sig-1") == info
        assert db.model_info_for("sig-2") == ModelInfo(
            name="rm-b", max_model_len=0, dtype="unknown", fingerprint="fp-b", engine="unknown"
        )
        db.remember_checkpoint("sig-1", path="/ckpt/1", fingerprint="fp-c", model="rm-a")
        assert db.fingerprint_for("sig-1") == "fp-c"
        assert sorted(c[0] for c in db.checkpoints()) == ["sig-1", "sig-2"]


def test_a_store_of_a_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    ScoreStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(StoreVersionError, match=f"schema version '{SCHEMA_VERSION + 1}'.*newer rmserve") as info:
        ScoreStore(path)
    assert info.value.field == "schema_version"


def test_a_file_that_is_not_a_store_is_a_data_error(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(errors.DataError, match="not a usable SQLite score store"):
        ScoreStore(path)


# --- evaluate() with a store --------------------------------------------------------------------


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
    with ScoreStore(store) as db:
        assert db.fingerprints() == [("fp-next", "rm-next", N_SMALL), ("fp-stub-1", "stub-rm", N_SMALL)]


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
    checkpoint = _fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
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
    checkpoint = _fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
    run(_run_config(checkpoint, small_rmbench, tmp_path / "a", store))
    (checkpoint / "model.safetensors").write_bytes(b"\x08" * 1024)
    with pytest.raises(errors.ServerFault, match="exited with status 3 before it was ready"):
        run(_run_config(checkpoint, small_rmbench, tmp_path / "b", store, "--fail-at-start"))
    assert (tmp_path / "b" / "server.log").is_file()


def test_run_without_store_remembers_nothing(small_rmbench, tmp_path):
    checkpoint = _fake_checkpoint(tmp_path / "step-1", b"\x07" * 1024)
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
    assert f"0 groups scored now, 0 resumed, {N_SMALL} from the store" in result.stderr

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
