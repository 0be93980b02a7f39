"""``rmserve eval`` against a user's token budget: requests are split until they fit, a group
that alone is over the budget is recorded as not scored (``request_over_limit``) and the run
goes on (exit 3), and a rerun sends that group again (the budget may have been raised).

The server is the real app over :class:`testkit.fakes.FakeEngine` with a users file. A
sequence of prompt P and response R costs ``5 + len(P) + len(R)`` tokens (fake chat template);
a group costs the sum over its six responses.
"""

from __future__ import annotations

import msgspec
import pytest
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, fake_ids, fake_reward
from testkit.servers import OVER_BUDGET_ROWS, write_jsonl

from rmserve.client.score_file import read_scores
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.schema import ResponseError
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.auth import add_user

ROWS = OVER_BUDGET_ROWS
BUDGET = 150
MAX_LEN = 1000
"""The fake model's max length: every sequence here fits, so every one is charged."""


def _engine() -> FakeEngine:
    return FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=MAX_LEN))


def cost(row) -> int:
    return sum(5 + len(row["prompt"]) + len(text) for text in [*row["chosen"], *row["rejected"]])


def test_the_costs_worked_out():
    assert [cost(r) for r in ROWS] == [60, 363, 60]  # 483 in one request; 120 of them fit the 150 a minute


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "rmbench.jsonl", ROWS)


@pytest.fixture
def budgets(tmp_path) -> dict[int, tuple[ServerConfig, str]]:
    """Tokens per minute → (config of a server whose user has that budget, the user's token)."""
    configs = {}
    for budget in (BUDGET, 10_000):
        path = tmp_path / f"users-{budget}.jsonl"
        token, _ = add_user(path, "alice", tokens_per_minute=budget)
        configs[budget] = ServerConfig(port=0, users_file=str(path)), token
    return configs


async def _server(aiohttp_client, config: ServerConfig):
    engine = _engine()
    app = create_app(config, engine, FakeRenderer(max_model_len=MAX_LEN))
    http = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return http, engine


def _config(http, token: str, data, out) -> EvalConfig:
    return EvalConfig(bench="rm-bench", data=str(data), out_dir=out, server_url=str(http.make_url("")), quiet=True,
                      resamples=0, token=token, groups_per_request=3, max_in_flight=3)


def _rewards(row) -> tuple[float, ...]:
    return tuple(fake_reward(fake_ids([("user", row["prompt"])], text)) for text in [*row["chosen"], *row["rejected"]])


async def test_eval_splits_to_fit_records_the_group_over_the_budget_and_a_rerun_sends_it_again(
    aiohttp_client, budgets, data, tmp_path
):
    config, token = budgets[BUDGET]
    http, engine = await _server(aiohttp_client, config)
    out = tmp_path / "out"
    result = await evaluate_async(_config(http, token, data, out), session=http.session)

    records = {r.id: r for r in read_scores(out / "scores.jsonl").records}
    assert records["0"].rewards == _rewards(ROWS[0]) and records["2"].rewards == _rewards(ROWS[2])
    message = (
        "the request holds 363 prompt tokens, more than user 'alice''s whole budget of 150 tokens per minute "
        "(tokens_per_minute of the users file), so it can never be admitted; send fewer groups per request (a "
        "group that alone holds more cannot be scored under this budget), or ask an admin for a larger "
        "tokens_per_minute"
    )
    assert records["1"].rewards == (None,) * 6
    assert records["1"].errors == (ResponseError("request_over_limit", message),) * 6
    assert result.unscored.keys == ("rm-bench/chat/1",)
    assert (
        f"1 of 3 groups not scored (1 over the user's token budget): counted as losses, as the official code "
        f"counts them; see {out / 'scores.jsonl'}"
    ) in result.notes
    assert len(engine.calls) == 2  # the group over the budget never reached the engine
    assert result.n_scored == 3  # the three groups were answered by this run, one of them not scored

    # a rerun sends the refused group again (and only it); with the same budget it is refused again
    again = await evaluate_async(_config(http, token, data, out), session=http.session)
    assert again.n_scored == 1 and len(engine.calls) == 2
    assert ("scoring again 1 group the server refused as over a limit of the user (the limit may have been "
            "raised since)") in again.notes

    # against a server where the user's budget is larger, the same command scores it
    larger, larger_token = budgets[10_000]
    http2, engine2 = await _server(aiohttp_client, larger)
    third = await evaluate_async(_config(http2, larger_token, data, out), session=http2.session)
    assert third.n_scored == 1 and third.unscored.keys == ()
    assert read_scores(out / "scores.jsonl").records[-1].rewards == _rewards(ROWS[1])


def test_cli_eval_over_the_budget_finishes_with_exit_3(budgets, data, tmp_path):
    from testkit.servers import ThreadedServer
    from typer.testing import CliRunner

    from rmserve.cli import app as cli_app

    config, token = budgets[BUDGET]
    token_file = tmp_path / "alice.token"
    token_file.write_text(token + "\n")
    out = tmp_path / "out"
    with ThreadedServer(lambda: create_app(config, _engine(), FakeRenderer(max_model_len=MAX_LEN))) as server:
        result = CliRunner().invoke(cli_app, [
            "eval", "--server", server.url, "--bench", "rm-bench", "--data", str(data), "--out", str(out),
            "--token-file", str(token_file), "--groups-per-request", "3", "--max-inflight-groups", "3", "--resamples", "0",
            "--quiet",
        ])
    assert result.exit_code == 3, result.output
    assert (
        f"note: 1 of 3 groups not scored (1 over the user's token budget): counted as losses, as the official code "
        f"counts them; see {out / 'scores.jsonl'}"
    ) in result.stderr
