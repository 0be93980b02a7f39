"""The client side of tokens: ``RewardClient(token=…)``, ``--token-file`` / ``RMSERVE_TOKEN`` on the
commands that talk to a server, and 401/403 as clear errors that are never retried."""

from __future__ import annotations

import msgspec
import pytest
import typer
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer
from testkit.servers import SleepRecorder, ThreadedServer, make_groups, write_rmbench_data
from typer.testing import CliRunner

from rmserve.cli import app as cli_app
from rmserve.cli_users import TOKEN_ENV, read_client_token
from rmserve.client import RewardClient
from rmserve.errors import Forbidden, Unauthorized
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.auth import add_user

BIG = 1_000_000
"""max_model_len of the fake model: the fake tokenizer is per character."""


@pytest.fixture
def users(tmp_path):
    path = tmp_path / "users.jsonl"
    alice, _ = add_user(path, "alice")
    return path, alice


@pytest.fixture
def config(users) -> ServerConfig:
    return ServerConfig(port=0, users_file=str(users[0]))


@pytest.fixture
async def base(aiohttp_client, config):
    engine = FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=BIG))
    app = create_app(config, engine, FakeRenderer(max_model_len=BIG))
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return client, engine


async def test_reward_client_sends_its_token_with_every_request(base, users):
    client, engine = base
    url = str(client.make_url(""))
    async with RewardClient(url, session=client.session, token=users[1]) as rc:
        (info,) = await rc.models()
        reply = await rc.score(make_groups(2))
    assert info.fingerprint == FAKE_MODEL.fingerprint
    assert [r.id for r in reply.results] == ["rm-bench/chat/0", "rm-bench/chat/1"]
    assert len(engine.calls) == 2


@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_a_401_is_a_clear_error_after_one_attempt(base, token):
    client, engine = base
    sleeps = SleepRecorder()
    async with RewardClient(str(client.make_url("")), session=client.session, token=token, sleep=sleeps) as rc:
        with pytest.raises(Unauthorized) as refused:
            await rc.score(make_groups(1))
        assert rc.attempts == 1 and sleeps.delays_s == []
    assert refused.value.status == 401
    if token is None:
        assert str(refused.value) == (
            "this server needs a token: send the header Authorization: Bearer <token>, or Basic credentials "
            "whose password is the token (a URL http://NAME:TOKEN@HOST:PORT/...; NAME is not checked) "
            "(this client sent no token: give --token-file FILE or set RMSERVE_TOKEN)"
        )
    else:
        assert str(refused.value) == "unknown token: no user of this server has it"
    assert engine.calls == []


async def test_a_scorer_swapping_gets_forbidden(base, users, tmp_path):
    client, _ = base
    async with RewardClient(str(client.make_url("")), session=client.session, token=users[1]) as rc:
        with pytest.raises(Forbidden, match="user 'alice' has the role 'scorer'; POST /v1/models/load needs the role"):
            await rc.load_checkpoint("x", str(tmp_path), admin_token=users[1])
        assert rc.attempts == 1


def test_the_token_file_wins_over_the_environment(tmp_path, monkeypatch):
    file = tmp_path / "token"
    file.write_text("from-file\n")
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert read_client_token(file) == "from-file"
    assert read_client_token(None) == "from-env"
    monkeypatch.delenv(TOKEN_ENV)
    assert read_client_token(None) is None
    file.write_text("  \n")
    with pytest.raises(typer.BadParameter, match="is empty"):
        read_client_token(file)
    file.write_text("two tokens\n")
    with pytest.raises(typer.BadParameter, match="must hold the token alone"):
        read_client_token(file)
    with pytest.raises(typer.BadParameter, match="cannot be read"):
        read_client_token(tmp_path / "missing")


def test_eval_takes_its_token_from_token_file_or_rmserve_token(config, users, tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    data = write_rmbench_data(tmp_path / "rmb.jsonl", n_chat=2, n_code=1)
    token_file = tmp_path / "alice.token"
    token_file.write_text(users[1] + "\n")

    def make_app():
        engine = FakeEngine(model=msgspec.structs.replace(FAKE_MODEL, max_model_len=BIG))
        return create_app(config, engine, FakeRenderer(max_model_len=BIG))

    with ThreadedServer(make_app) as server:
        def run(out: str, *extra: str, env: dict[str, str] | None = None):
            argv = ["eval", "--server", server.url, "--bench", "rm-bench", "--data", str(data),
                    "--out", str(tmp_path / out), "--resamples", "0", "--quiet", *extra]
            return CliRunner().invoke(cli_app, argv, env=env)

        refused = run("none")
        assert refused.exit_code == 1
        assert "error: unauthorized: this server needs a token" in refused.stderr
        assert "give --token-file FILE or set RMSERVE_TOKEN" in refused.stderr
        by_file = run("file", "--token-file", str(token_file), env={TOKEN_ENV: "a-wrong-token"})
        assert by_file.exit_code == 0, by_file.output
        by_env = run("env", env={TOKEN_ENV: users[1]})
        assert by_env.exit_code == 0, by_env.output
        wrong = run("wrong", env={TOKEN_ENV: "a-wrong-token"})
        assert wrong.exit_code == 1
        assert "error: unauthorized: unknown token" in wrong.stderr
    for out in ("file", "env"):
        assert len((tmp_path / out / "scores.jsonl").read_text().splitlines()) == 3
