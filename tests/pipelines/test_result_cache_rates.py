"""An evaluation the server answers from its result cache says so and leaves it out of its rates.

A second eval of the same data into a new folder (no store) is answered by the server's result
cache: no engine work. Its progress line used to report hundreds of groups/s and a million tok/s.
"""

from __future__ import annotations

import logging

import orjson
import pytest
from rmserve.pipelines.evaluate import EvalConfig, evaluate_async
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from testkit.fakes import FakeEngine, FakeRenderer

ROWS = [
    {"id": k, "domain": "chat", "prompt": f"p{k}", "chosen": ["c" * (10 + k), "d" * 11, "e" * 12],
     "rejected": ["r" * 3, "s" * 4, "t" * (5 + k)]}
    for k in range(3)
]


@pytest.fixture
async def server(aiohttp_client):
    engine = FakeEngine()
    app = create_app(ServerConfig(port=0, result_cache_groups=16), engine, FakeRenderer())
    http = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return http, engine


async def test_groups_from_the_result_cache_are_named_and_left_out_of_the_rates(server, tmp_path, capsys, caplog):
    http, engine = server
    data = tmp_path / "rmbench.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS))

    def config(out):
        return EvalConfig(bench="rm-bench", data=str(data), out_dir=tmp_path / out, server_url=str(http.make_url("")),
                          resamples=0, quiet=False)

    await evaluate_async(config("a"), session=http.session)
    calls = len(engine.calls)
    first = capsys.readouterr().err
    assert "from the result cache" not in first
    with caplog.at_level(logging.INFO, logger="rmserve"):
        await evaluate_async(config("b"), session=http.session)
    assert len(engine.calls) == calls  # every group came from the server's result cache
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("scoring: ")][-1]
    assert last.startswith("scoring: 3/3 groups, none by the engine, done in ")
    assert last.endswith(", 3 from the result cache, 0 tok/s (engine work only)")
    assert ("3 of the 3 groups scored were answered from the server's result cache (the same model scored them "
            "before); the rates leave them out") in caplog.messages
