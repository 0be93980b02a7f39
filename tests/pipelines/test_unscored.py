"""A run finishes when some groups cannot be scored: each is recorded, counted as the official
code counts it (a NaN comparison loses), named at the end; ``strict`` stops at the first one;
a rerun re-sends them only when the options changed.

The server is the real app over :class:`testkit.fakes.FakeEngine` and
:class:`~testkit.fakes.FakeRenderer` (max length 200 tokens), so every reward is
``fake_reward(fake_ids(...))`` and every figure below is worked out in the test.
"""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from rmserve.client.score_file import read_scores
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.engines.protocol import SequenceScore
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, fake_ids, fake_reward
from testkit.servers import write_jsonl

from rmserve import errors
from rmserve.schema import ResponseError, Truncation

MAX_LEN = 200
ROWS = [
    {"id": 0, "domain": "chat", "prompt": "p0", "chosen": ["c" * 20, "c" * 21, "c" * 22], "rejected": ["r" * 5, "r" * 6, "r" * 7]},
    # chosen[0] renders to BOS + user turn (1 + 2 + 1) + assistant turn (1 + 300 + 1) = 307 tokens, over 200
    {"id": 1, "domain": "chat", "prompt": "p1", "chosen": ["c" * 300, "d" * 21, "e" * 9], "rejected": ["r" * 30, "s" * 6, "t" * 7]},
    # rejected[2] holds a "z": the engine below answers NaN for it
    {"id": 2, "domain": "chat", "prompt": "p2", "chosen": ["a" * 12, "b" * 13, "c" * 14], "rejected": ["x" * 3, "y" * 40, "z" * 8]},
]


class NaNForZ(FakeEngine):
    """:class:`FakeEngine` that answers NaN for a sequence holding the letter ``z``."""

    async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
        scores = await super().score_group(token_ids, request_id)
        return [
            SequenceScore(math.nan if ord("z") in ids else s.reward, s.num_cached_tokens)
            for ids, s in zip(token_ids, scores, strict=True)
        ]


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "rmbench.jsonl", ROWS)


@pytest.fixture
async def server(aiohttp_client):
    engine = NaNForZ(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=MAX_LEN))
    app = create_app(ServerConfig(port=0), engine, FakeRenderer(max_model_len=MAX_LEN))
    http = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return http, engine


def _config(http, data, out, **kwargs) -> EvalConfig:
    return EvalConfig(bench="rm-bench", data=str(data), out_dir=out, server_url=str(http.make_url("")),
                      quiet=True, resamples=0, **kwargs)


def _expected_rewards(row) -> list[float]:
    """Each response's reward by hand: NaN for the over-length one and the one with a "z"."""
    rewards = []
    for text in [*row["chosen"], *row["rejected"]]:
        ids = fake_ids([("user", row["prompt"])], text)
        rewards.append(math.nan if len(ids) > MAX_LEN or "z" in text else fake_reward(ids))
    return rewards


def _official_rmbench(rows) -> dict[str, float]:
    """THU-KEG/RM-Bench ``compute_accuracy`` on these rows, written out: M[i][j] = mean over groups
    of (chosen_i > rejected_j), a NaN comparison False; hard = mean of i < j, normal = i == j,
    easy = i > j; the domain score is the mean of the nine cells."""
    m = [[0.0] * 3 for _ in range(3)]
    for row in rows:
        r = _expected_rewards(row)
        for i in range(3):
            for j in range(3):
                m[i][j] += (r[i] > r[3 + j]) / len(rows)
    cells = [(i, j) for i in range(3) for j in range(3)]
    return {
        "hard": sum(m[i][j] for i, j in cells if i < j) / 3,
        "normal": sum(m[i][j] for i, j in cells if i == j) / 3,
        "easy": sum(m[i][j] for i, j in cells if i > j) / 3,
        "score": sum(m[i][j] for i, j in cells) / 9,
    }


async def test_the_run_finishes_records_each_unscored_group_and_names_them(server, data, tmp_path):
    http, _ = server
    out = tmp_path / "out"
    result = await evaluate_async(_config(http, data, out), session=http.session)

    records = {r.id: r for r in read_scores(out / "scores.jsonl").records}
    assert records["0"].errors is None
    assert records["1"].rewards[0] is None and records["1"].rewards[1:] == tuple(_expected_rewards(ROWS[1])[1:])
    assert records["1"].errors == (
        ResponseError("sequence_too_long", "307 tokens (chat template included), over max_model_len=200"),
        None, None, None, None, None,
    )
    assert records["2"].rewards[5] is None
    assert records["2"].errors[5] == ResponseError("non_finite_reward", "the model gave a non-finite reward (nan) for it")
    assert result.unscored.keys == ("rm-bench/chat/1", "rm-bench/chat/2")
    assert (
        f"2 of 3 groups not scored (1 over the length limit of 200 tokens, 1 non-finite reward): counted as losses, "
        f"as the official code counts them; see {out / 'scores.jsonl'}; to score those over the length limit, raise "
        "the server's --max-model-len or pass --truncation, and run the same command again (only they are sent "
        "again)"
    ) in result.notes

    figures = json.loads((out / "results.json").read_text())["domains"]["chat"]
    expected = _official_rmbench(ROWS)
    assert {k: figures[k] for k in expected} == pytest.approx(expected)
    assert figures["n_nan_groups"] == 2


async def test_strict_stops_at_the_first_unscored_group_after_recording_it(server, data, tmp_path):
    http, _ = server
    out = tmp_path / "out"
    with pytest.raises(errors.GroupNotScored, match=r"^group 'rm-bench/chat/1' could not be scored \(sequence_too_long: 307 tokens"):
        await evaluate_async(_config(http, data, out, strict=True, max_in_flight=1), session=http.session)
    assert [r.id for r in read_scores(out / "scores.jsonl").records] == ["0", "1"]


async def test_a_rerun_resends_failed_groups_only_when_the_options_changed(server, data, tmp_path):
    http, engine = server
    out = tmp_path / "out"
    await evaluate_async(_config(http, data, out), session=http.session)
    sent = len(engine.calls)
    again = await evaluate_async(_config(http, data, out), session=http.session)
    assert len(engine.calls) == sent and again.n_scored == 0  # same options: nothing re-sent

    cut = Truncation(side="left", max_tokens=100)
    third = await evaluate_async(_config(http, data, out, truncation=cut), session=http.session)
    assert third.n_scored == 2  # both failed groups, not the scored one
    assert any(n.startswith("scoring again 2 groups that could not be scored under other options") for n in third.notes)
    records = {r.id: r for r in read_scores(out / "scores.jsonl").records}
    # 307 tokens cut from the left to 100: 208 tokens cut from chosen[0] of group 1, which is now scored.
    assert records["1"].truncated_tokens == (207, 0, 0, 0, 0, 0) and records["1"].errors is None
    assert records["1"].truncation == cut
    assert records["2"].errors[5].type == "non_finite_reward"  # the model still gives NaN for it
    assert third.truncation.n_groups_cut == 1 and third.truncation.n_tokens_cut == 207
    assert (
        "truncation: 1 of the 2 groups scored under it were cut, 207 tokens in all; no chosen and rejected "
        "response came out identical"
    ) in third.notes


async def test_a_rerun_on_a_server_with_a_longer_max_model_len_scores_the_too_long_group(
    server, data, tmp_path, aiohttp_client
):
    """Group 1's chosen[0] is 307 tokens, over 200. The same model served at 400 tokens (same
    fingerprint: the limit is not part of it) scores it on the rerun, and only it: group 2's
    NaN has another cause and stays."""
    http, engine = server
    out = tmp_path / "out"
    await evaluate_async(_config(http, data, out), session=http.session)
    longer = NaNForZ(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=400))
    app = create_app(ServerConfig(port=0), longer, FakeRenderer(max_model_len=400))
    http_longer = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    again = await evaluate_async(_config(http_longer, data, out), session=http_longer.session)
    assert again.n_scored == 1 and len(longer.calls) == 1
    assert "scoring again 1 group with a response that was over a shorter max_model_len than the server's 400 " \
        "tokens now" in again.notes
    records = {r.id: r for r in read_scores(out / "scores.jsonl").records}
    ids = fake_ids([("user", "p1")], "c" * 300)
    assert records["1"].errors is None and records["1"].rewards[0] == pytest.approx(fake_reward(ids))
    assert records["2"].errors[5].type == "non_finite_reward"


async def test_the_store_answers_a_run_alone_only_while_its_limit_is_the_one_the_too_long_group_was_over(
    server, data, tmp_path
):
    """``run`` answers from the store without a server (``evaluate_from_store``) under the same
    max_model_len; asked for a longer one (``run --max-model-len 400``), group 1 is missing and
    ``run`` starts its server."""
    from rmserve.pipelines.evaluate import evaluate_from_store_async

    http, _ = server
    store = tmp_path / "s.sqlite"
    first = await evaluate_async(_config(http, data, tmp_path / "out", store=store), session=http.session)
    info = first.model
    same = await evaluate_from_store_async(_config(http, data, tmp_path / "again", store=store), info)
    assert same is not None and same.unscored.keys == ("rm-bench/chat/1", "rm-bench/chat/2")
    longer = msgspec.structs.replace(info, max_model_len=400)
    assert await evaluate_from_store_async(_config(http, data, tmp_path / "longer", store=store), longer) is None
    assert not (tmp_path / "longer").exists()  # decided from the store: nothing written for the server's run


async def test_a_new_folder_on_a_longer_server_counts_only_what_the_store_answers(server, data, tmp_path,
                                                                                   aiohttp_client):
    """A new --out with the store: groups 0 and 2 come from the store (2's NaN has another
    cause), group 1 is scored again; the notes say exactly that."""
    http, _ = server
    store = tmp_path / "s.sqlite"
    await evaluate_async(_config(http, data, tmp_path / "out", store=store), session=http.session)
    app = create_app(ServerConfig(port=0), NaNForZ(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=400)),
                     FakeRenderer(max_model_len=400))
    longer = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    result = await evaluate_async(_config(longer, data, tmp_path / "new", store=store), session=longer.session)
    assert (result.n_scored, result.n_from_store, result.n_resumed) == (1, 2, 0)
    assert f"answered from the store: 2 groups ({store})" in result.notes
    assert "scoring again 1 group with a response that was over a shorter max_model_len than the server's 400 " \
        "tokens now" in result.notes
    assert not any(n.startswith("resumed:") for n in result.notes)


async def test_the_score_file_answers_a_run_alone_only_while_its_limit_is_the_one_the_group_was_over(
    server, data, tmp_path
):
    """``run`` without a store answers from ``OUT/scores.jsonl`` (``evaluate_from_file``) under the
    same max_model_len; with a longer one group 1 is stale and ``run`` starts its server, the file
    left as it was."""
    from rmserve.pipelines.evaluate import evaluate_from_file_async

    http, _ = server
    out = tmp_path / "out"
    first = await evaluate_async(_config(http, data, out), session=http.session)
    info = first.model
    same = await evaluate_from_file_async(_config(http, data, out), info.fingerprint, lambda name: info)
    assert same is not None and same.unscored.keys == ("rm-bench/chat/1", "rm-bench/chat/2")
    before = (out / "scores.jsonl").read_bytes()
    longer = msgspec.structs.replace(info, max_model_len=400)
    assert await evaluate_from_file_async(_config(http, data, out), info.fingerprint, lambda name: longer) is None
    assert (out / "scores.jsonl").read_bytes() == before


def test_length_limit_raised_reads_the_limit_the_response_was_over():
    from rmserve.client.score_log import length_limit_raised
    from rmserve.schema import ScoreRecord

    def record(*errors_):
        return ScoreRecord(benchmark="rm-bench", domain="chat", id="1", num_chosen=1, rewards=(None, 0.5),
                           errors=errors_)

    over = record(ResponseError("sequence_too_long", "5,000 tokens (chat template included), over max_model_len=4,096"),
                  None)
    assert length_limit_raised(over, 8192) and not length_limit_raised(over, 4096)
    assert not length_limit_raised(over, 2048)
    unnamed = record(ResponseError("sequence_too_long", "too long for the judge's prompt"), None)
    assert not length_limit_raised(unnamed, 1_000_000)
    other = record(ResponseError("non_finite_reward", "nan (max_model_len=10)"), None)
    assert not length_limit_raised(other, 1_000_000)


def test_a_chosen_and_a_rejected_response_identical_after_the_cut_are_named():
    from rmserve.pipelines.outcome import truncation_summary
    from rmserve.schema import ScoreRecord

    cut = Truncation(side="right", max_tokens=8)
    same = ScoreRecord(benchmark="rm-bench", domain="chat", id="7", num_chosen=1, rewards=(0.5, 0.5),
                       num_tokens=(8, 8), truncated_tokens=(30, 12), truncation=cut)
    apart = ScoreRecord(benchmark="rm-bench", domain="chat", id="8", num_chosen=1, rewards=(0.5, 0.25),
                        num_tokens=(8, 8), truncated_tokens=(3, 4), truncation=cut)
    summary = truncation_summary([same, apart])
    assert summary.identical_after_cut == ("rm-bench/chat/7",)
    assert summary.sentence() == (
        "truncation: 2 of the 2 groups scored under it were cut, 49 tokens in all; 1 groups have a chosen and a "
        "rejected response identical after the cut (it left nothing that told them apart: rm-bench/chat/7)"
    )


def test_cli_eval_finishes_with_exit_3_and_names_the_unscored_groups(data, tmp_path):
    from testkit.servers import ThreadedServer
    from typer.testing import CliRunner

    from rmserve.cli import app as cli_app

    def make_app():
        engine = NaNForZ(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=MAX_LEN))
        return create_app(ServerConfig(port=0), engine, FakeRenderer(max_model_len=MAX_LEN))

    out = tmp_path / "out"
    with ThreadedServer(make_app) as server:
        argv = ["eval", "--server", server.url, "--bench", "rm-bench", "--data", str(data), "--out", str(out),
                "--resamples", "0", "--quiet"]
        result = CliRunner().invoke(cli_app, argv)
        assert result.exit_code == 3, result.output
        assert (
            f"note: 2 of 3 groups not scored (1 over the length limit of 200 tokens, 1 non-finite reward): counted "
            f"as losses, as the official code counts them; see {out / 'scores.jsonl'}; to score those"
        ) in result.stderr
        strict = CliRunner().invoke(cli_app, [*argv[:-5], "--out", str(tmp_path / "strict"), "--strict",
                                              "--max-inflight-groups", "1", "--resamples", "0", "--quiet"])
        assert strict.exit_code == 1
        assert "error: group_not_scored: group 'rm-bench/chat/1' could not be scored" in strict.stderr
        half = CliRunner().invoke(cli_app, [*argv, "--truncation", "left"])
        assert half.exit_code == 2
        assert "--truncation and --max-tokens go together" in half.stderr
