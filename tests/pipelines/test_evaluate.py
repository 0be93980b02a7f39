"""The eval pipeline (``rmserve.pipelines.evaluate.evaluate``, not the metrics stage's): scoring
through the stub, resume, interrupted runs, model checks, report files."""

from __future__ import annotations

import json

import msgspec
import pytest
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async, pick_model
from rmserve.client.score_file import read_scores

from rmserve import errors
from rmserve.schema import ModelInfo

N_SMALL = 10  # groups in the small_rmbench fixture (6 chat + 4 code)


def _config(stub_http, data, out_dir, **kwargs) -> EvalConfig:
    kwargs.setdefault("resamples", 0)
    kwargs.setdefault("quiet", True)
    return EvalConfig(bench="rm-bench", data=str(data), out_dir=out_dir, server_url=str(stub_http.make_url("")), **kwargs)


async def _run(stub_http, config):
    return await evaluate_async(config, session=stub_http.session)


async def test_scores_every_group_and_writes_the_report(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "out"
    result = await _run(stub_http, _config(stub_http, small_rmbench, out, max_in_flight=3))
    assert (result.n_groups, result.n_scored, result.n_resumed) == (N_SMALL, N_SMALL, 0)
    assert stub_state.score_requests == N_SMALL
    stored = read_scores(out / "scores.jsonl")
    assert len({r.key for r in stored.records}) == N_SMALL
    assert {r.fingerprint for r in stored.records} == {"fp-stub-1"}
    # Chosen responses are longer in chat and shorter in code; the stub's reward grows with
    # length, so chat wins every comparison and code none.
    results = json.loads((out / "results.json").read_text())
    assert results["domains"]["chat"]["score"] == 1.0
    assert results["domains"]["code"]["score"] == 0.0
    assert "math" in results["missing"]
    assert (out / "table.md").read_text() == result.table_md
    assert "math" in result.table_md  # the missing domain is named in the table
    assert result.missing == ("math", "safety-refuse", "safety-response")
    assert any("not in the data" in n and "math" in n for n in result.notes)


async def test_rerun_sends_no_scoring_request(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "out"
    first = await _run(stub_http, _config(stub_http, small_rmbench, out))
    sent = stub_state.score_requests
    second = await _run(stub_http, _config(stub_http, small_rmbench, out))
    assert stub_state.score_requests == sent
    assert (second.n_scored, second.n_resumed) == (0, N_SMALL)
    assert second.results == first.results
    assert len(read_scores(out / "scores.jsonl").records) == N_SMALL


async def test_failed_run_keeps_answered_groups_and_rerun_scores_the_rest(
    stub, stub_http, stub_state, small_rmbench, tmp_path
):
    out = tmp_path / "out"
    bad = "rm-bench/chat/4"
    stub_state.fail_ids[bad] = stub.Failure(413, "sequence_too_long")
    with pytest.raises(errors.SequenceTooLong):
        await _run(stub_http, _config(stub_http, small_rmbench, out, max_in_flight=2))
    kept = {str(r.key) for r in read_scores(out / "scores.jsonl").records}
    assert bad not in kept and kept  # groups answered before the failure are on disk
    assert not (out / "results.json").exists()

    del stub_state.fail_ids[bad]
    before = len(stub_state.received_ids)
    result = await _run(stub_http, _config(stub_http, small_rmbench, out, max_in_flight=2))
    resent = stub_state.received_ids[before:]
    all_keys = {f"rm-bench/chat/{i}" for i in range(6)} | {f"rm-bench/code/{i}" for i in range(4)}
    assert sorted(resent) == sorted(all_keys - kept)  # exactly the remainder, each once
    assert (result.n_scored, result.n_resumed) == (N_SMALL - len(kept), len(kept))
    records = read_scores(out / "scores.jsonl").records
    assert len(records) == N_SMALL and {str(r.key) for r in records} == all_keys


async def test_truncated_last_line_is_reported_and_its_group_rescored(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "out"
    await _run(stub_http, _config(stub_http, small_rmbench, out))
    path = out / "scores.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lost = msgspec.json.decode(lines[-1])
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:25])  # killed mid-write
    before = len(stub_state.received_ids)
    result = await _run(stub_http, _config(stub_http, small_rmbench, out))
    assert stub_state.received_ids[before:] == [f"{lost['benchmark']}/{lost['domain']}/{lost['id']}"]
    assert any("truncated last line" in n for n in result.notes)
    assert len(read_scores(path).records) == N_SMALL


async def test_other_models_scores_are_refused_unless_overwrite(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "out"
    await _run(stub_http, _config(stub_http, small_rmbench, out))
    stub_state.model = msgspec.structs.replace(stub_state.model, name="other-rm", fingerprint="fp-other")
    sent = stub_state.score_requests
    with pytest.raises(errors.FingerprintMismatch, match="different model"):
        await _run(stub_http, _config(stub_http, small_rmbench, out))
    assert stub_state.score_requests == sent
    result = await _run(stub_http, _config(stub_http, small_rmbench, out, overwrite=True))
    assert result.n_scored == N_SMALL
    assert stub_state.score_requests == sent + N_SMALL
    assert {r.fingerprint for r in read_scores(out / "scores.jsonl").records} == {"fp-other"}


async def test_only_selected_domain_is_scored(stub_http, stub_state, small_rmbench, tmp_path):
    result = await _run(stub_http, _config(stub_http, small_rmbench, tmp_path / "o", only=("code",)))
    assert result.n_scored == 4
    assert {i.split("/")[1] for i in stub_state.received_ids} == {"code"}


async def test_server_not_ready_in_time(stub_http, stub_state, small_rmbench, tmp_path):
    stub_state.ready = False
    with pytest.raises(errors.EngineNotReady, match="not ready after"):
        await _run(stub_http, _config(stub_http, small_rmbench, tmp_path / "o", ready_timeout_s=0.3))
    assert stub_state.score_requests == 0
    assert not (tmp_path / "o").exists()  # nothing is created before the server answers


async def test_run_that_scores_no_group_leaves_no_output(stub, stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "runs" / "o"
    stub_state.failures = [stub.Failure(500, "engine_error")] * 50
    with pytest.raises(errors.EngineError):
        await _run(stub_http, _config(stub_http, small_rmbench, out, max_attempts=1, max_in_flight=1))
    assert stub_state.score_requests >= 1  # the server was reached and the first request failed
    assert not (tmp_path / "runs").exists()  # neither the score file nor the folders made for it


async def test_failed_rerun_leaves_a_resumed_score_file_as_it_was(stub, stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    path = out / "scores.jsonl"
    first = await _run(stub_http, _config(stub_http, small_rmbench, out, only=("code",)))
    assert first.n_scored == 4
    before = path.read_bytes()
    stub_state.failures = [stub.Failure(500, "engine_error")] * 50
    with pytest.raises(errors.EngineError):
        await _run(stub_http, _config(stub_http, small_rmbench, out, max_attempts=1, max_in_flight=1))
    assert path.read_bytes() == before
    assert (out / "notes.txt").read_text() == "mine"


async def test_empty_score_file_from_before_stays(stub, stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "scores.jsonl").write_bytes(b"")
    stub_state.failures = [stub.Failure(500, "engine_error")] * 50
    with pytest.raises(errors.EngineError):
        await _run(stub_http, _config(stub_http, small_rmbench, out, max_attempts=1, max_in_flight=1))
    assert (out / "scores.jsonl").read_bytes() == b""  # not this run's file: left alone


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"bench": "mmlu"}, "bench must be one of rm-bench, rewardbench2"),
        ({"max_in_flight": 0}, "max_in_flight must be an integer in [1, 4096]"),
        ({"groups_per_request": 9, "max_in_flight": 8}, "groups_per_request must be an integer in [1, 8]"),
        ({"timeout_s": 0}, "timeout_s must be a finite number of seconds > 0"),
        ({"server_url": "localhost:8000"}, "http"),
    ],
)
def test_config_rejects_bad_values(tmp_path, kwargs, words):
    base = {"bench": "rm-bench", "data": "x", "out_dir": tmp_path}
    with pytest.raises(ValueError) as info:
        EvalConfig(**{**base, **kwargs})
    assert words in str(info.value)


def test_pick_model():
    a = ModelInfo(name="a", max_model_len=8, dtype="f", fingerprint="1", engine="e")
    b = ModelInfo(name="b", max_model_len=8, dtype="f", fingerprint="2", engine="e")
    assert pick_model([a], None) is a
    assert pick_model([a, b], "b") is b
    with pytest.raises(errors.ModelNotFound, match="name one with --model"):
        pick_model([a, b], None)
    with pytest.raises(errors.ModelNotFound, match="does not serve 'c'"):
        pick_model([a, b], "c")



async def test_resume_notes_come_in_order_and_name_the_score_file(stub_http, stub_state, small_rmbench, tmp_path):
    out = tmp_path / "out"
    await _run(stub_http, _config(stub_http, small_rmbench, out, max_in_flight=1))
    path = out / "scores.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == N_SMALL
    torn = lines[-1][:-10]
    path.write_bytes(b"".join(lines[:-1]) + torn)  # the last line torn mid-write
    result = await _run(stub_http, _config(stub_http, small_rmbench, out, only=("code",)))
    # One code group lost its line: it is scored again; the other three are resumed.
    assert stub_state.score_requests == N_SMALL + 1
    assert (result.n_scored, result.n_resumed, result.n_from_store) == (1, 3, 0)
    # (With --only, domains outside the selection are not reported missing.)
    assert result.missing == ()
    assert result.notes == (
        f"{path}: ignored a truncated last line (line {N_SMALL}, {len(torn)} bytes, no newline and not valid JSON: an interrupted write); "
        "its group will be scored again",
        f"resumed: 3 groups already in {path}, 1 to score",
        "6 stored groups are not in this data and are left out of the figures",
    )


async def test_the_resume_note_is_written_before_scoring_starts_and_not_again(
        stub_http, stub_state, small_rmbench, tmp_path, capsys):
    out = tmp_path / "out"
    await _run(stub_http, _config(stub_http, small_rmbench, out, only=("chat",)))
    capsys.readouterr()
    seen_at_first_request: list[str] = []

    def snapshot(request, results):
        if not seen_at_first_request:
            seen_at_first_request.append(capsys.readouterr().err)
        return results

    stub_state.reply_tamper = snapshot
    result = await _run(stub_http, _config(stub_http, small_rmbench, out))
    path = out / "scores.jsonl"
    n_chat = result.n_resumed
    resumed = f"note: resumed: {n_chat} groups already in {path}, {N_SMALL - n_chat} to score\n"
    assert 0 < n_chat < N_SMALL
    assert resumed in seen_at_first_request[0]  # known before the first group is sent
    assert result.notes_shown == len(result.notes) >= 1
    assert f"resumed: {n_chat} groups" in result.notes[result.notes_shown - 1]


async def test_no_note_is_written_early_when_nothing_is_left_to_score(stub_http, stub_state, small_rmbench, tmp_path,
                                                                     capsys):
    out = tmp_path / "out"
    await _run(stub_http, _config(stub_http, small_rmbench, out))
    capsys.readouterr()
    result = await _run(stub_http, _config(stub_http, small_rmbench, out))
    assert result.notes_shown == 0 and "resumed:" in result.notes[-1]
    assert "note:" not in capsys.readouterr().err  # the command prints them once, with the table
