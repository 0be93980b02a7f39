"""A generative judge's records on the client side: what is sent, the record kept, the score
file and the score store (v2 → v3 migration), and a real judge app through the client."""

from __future__ import annotations

import sqlite3

import msgspec
import pytest
from testkit.judge_fakes import FakeJudgeEngine, rb2_group, rmbench_group
from rmserve.client.client import RewardClient
from rmserve.client.records import record_from_result, request_group
from rmserve.client.score_file import ScoreFileWriter, read_scores
from rmserve.client.score_store import SCHEMA_VERSION, ScoreStore
from rmserve.server.kinds.judge_protocols import JudgeOutput, JudgeProtocolConfig, plan_group, score_group

from rmserve.schema import GroupResult, ModelInfo, ScoreKind, ScoreRecord, encode

JUDGE_KIND = ScoreKind(kind="judge", mode="auto")


def judged(group, texts, *, cached=0):
    """The judge record of ``group`` with the outputs ``texts`` (one per planned call)."""
    config = JudgeProtocolConfig()
    plan = plan_group(group, config)
    outputs = [JudgeOutput(text=t, prompt_tokens=100 + k, completion_tokens=len(t), finish_reason="stop",
                           cached_tokens=cached if k else 0) for k, t in enumerate(texts)]
    return score_group(group, plan, outputs, config)


def judge_record(group, texts, rewards) -> ScoreRecord:
    judge = judged(group, texts)
    n = len(group.responses)
    result = GroupResult(id=str(group.key), rewards=rewards, num_tokens=(10,) * n, num_cached_tokens=(0,) * n,
                         judge=judge)
    return record_from_result(group, result, model="judge-7b", fingerprint="fp-judge", kind=JUDGE_KIND)


def test_num_chosen_and_styles_are_sent_to_a_judge_only():
    group = rmbench_group("chat", "1")
    plain = encode(request_group(group))
    assert b"num_chosen" not in plain and b"styles" not in plain
    assert plain == (
        b'{"id":"rm-bench/chat/1","responses":["GOOD hello concise","GOOD hello detailed_plain",'
        b'"GOOD hello detailed_markdown","bye concise","bye detailed_plain","bye detailed_markdown"],'
        b'"messages":[{"role":"user","content":"Say hello."}]}'
    )
    judge = encode(request_group(group, judge=True))
    assert judge == plain[:-1] + (
        b',"num_chosen":3,"styles":["concise","detailed_plain","detailed_markdown",'
        b'"concise","detailed_plain","detailed_markdown"],"benchmark":"rm-bench","domain":"chat"}'
    )
    rb2 = encode(request_group(rb2_group("Math", "2"), judge=True))
    assert rb2.endswith(b',"num_chosen":1,"benchmark":"rewardbench2","domain":"Math"}')


def test_record_from_result_copies_the_judge():
    group = rb2_group("Math", "2")
    record = judge_record(group, ["best is [[A]]"], (1.0, 0.0, 0.0, 0.0))
    assert record.judge is not None and record.judge.calls[0].text == "best is [[A]]"
    assert record.kind == "judge" and record.mode == "auto"
    assert msgspec.json.decode(encode(record), type=ScoreRecord) == record


def test_judge_records_round_trip_through_the_score_file_and_the_store(tmp_path):
    records = [
        judge_record(rb2_group("Math", "2"), ["verdict [[B]]"], (0.0, 1.0, 0.0, 0.0)),
        judge_record(rb2_group("Ties", "3", correct=2, rejected=3), ["7", "Rating: 9", "no", "2", "1"],
                     (7.0, 9.0, -1.0, 2.0, 1.0)),
        judge_record(rmbench_group("chat", "4"), ["\\boxed{A>B}"] * 18, (1.0,) * 3 + (0.0,) * 3),
    ]
    path = tmp_path / "scores.jsonl"
    with ScoreFileWriter(path) as writer:
        for record in records:
            writer.append(record)
    assert read_scores(path).records == tuple(records)
    with ScoreStore(tmp_path / "s.sqlite") as store:
        for record in records:
            store.put(record)
        assert store.records("fp-judge") == sorted(records, key=lambda r: (r.benchmark, r.domain, r.id))
        store.export_jsonl(tmp_path / "export.jsonl", "fp-judge", keys=[r.key for r in records])
    assert (tmp_path / "export.jsonl").read_bytes() == path.read_bytes()
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        rows = conn.execute("SELECT domain, kind, mode, judge_protocol, judge_parse_failures FROM scores "
                            "ORDER BY domain").fetchall()
    conn.close()
    # Ties: "no" gives no rating (1 failure); the ranking and pairwise outputs all parse
    assert rows == [("Math", "judge", "auto", "rb2-ranking", 0), ("Ties", "judge", "auto", "rb2-rating-ties", 1),
                    ("chat", "judge", "auto", "rmbench-pairwise", 0)]


_V2_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE scores (
    fingerprint TEXT NOT NULL, benchmark TEXT NOT NULL, domain TEXT NOT NULL, group_id TEXT NOT NULL,
    model TEXT NOT NULL, num_chosen INTEGER NOT NULL, rewards TEXT NOT NULL, num_tokens TEXT NOT NULL,
    num_cached_tokens TEXT NOT NULL, record TEXT NOT NULL, server_version TEXT NOT NULL, scored_at REAL NOT NULL,
    kind TEXT NOT NULL DEFAULT 'classifier', mode TEXT, ref_model TEXT, compat TEXT NOT NULL DEFAULT 'none',
    extras TEXT,
    PRIMARY KEY (fingerprint, benchmark, domain, group_id)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
    signature TEXT PRIMARY KEY, path TEXT NOT NULL, fingerprint TEXT NOT NULL, model TEXT NOT NULL,
    model_info TEXT, seen_at REAL NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '2');
"""

DPO_LINE = (
    '{"benchmark":"rm-bench","domain":"chat","id":"3","num_chosen":1,"rewards":[1.5,-1.5],"model":"p",'
    '"fingerprint":"fp-dpo","kind":"dpo","mode":"avg"}'
)


def test_a_version_2_store_is_migrated_to_3(tmp_path):
    path = tmp_path / "v2.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(_V2_SCHEMA)
        conn.execute("INSERT INTO scores VALUES ('fp-dpo', 'rm-bench', 'chat', '3', 'p', 1, '[1.5,-1.5]', '[]', '[]', ?, "
                     "'0.1', 1.0, 'dpo', 'avg', NULL, 'none', NULL)", (DPO_LINE,))
    conn.close()
    assert SCHEMA_VERSION == 3
    record = judge_record(rb2_group("Math", "2"), ["no verdict here"], (0.25,) * 4)
    with ScoreStore(path) as store:
        assert store.records("fp-dpo") == [msgspec.json.decode(DPO_LINE, type=ScoreRecord)]
        store.put(record)
        assert store.records("fp-judge") == [record]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
        rows = conn.execute("SELECT fingerprint, judge_protocol, judge_parse_failures FROM scores "
                            "ORDER BY fingerprint").fetchall()
    conn.close()
    assert rows == [("fp-dpo", None, None), ("fp-judge", "rb2-ranking", 1)]


# --- through the wire -------------------------------------------------------------------------


@pytest.fixture
async def judge_http(aiohttp_client):
    from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app

    engine = FakeJudgeEngine()
    app = create_app(ServerConfig(port=0), engine)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    return client, engine


async def test_a_judge_server_s_records_carry_the_judge(judge_http):
    http, engine = judge_http
    groups = [rb2_group("Focus", "1"), rb2_group("Ties", "2", correct=2, rejected=3), rmbench_group("chat", "3")]
    async with RewardClient(str(http.make_url("")), session=http.session) as client:
        (info,) = await client.models()
        kind = ScoreKind.of(info)
        records = {r.key: r async for r in client.score_stream(groups, kind=kind)}
    assert info.kind == "judge" and kind == ScoreKind(kind="judge", mode="auto")
    assert len(records) == 3
    focus, ties, chat = (records[g.key] for g in groups)
    assert focus.rewards == (1.0, 0.0, 0.0, 0.0) and focus.judge.credit == 1.0
    assert ties.rewards == (8.0, 8.0, 3.0, 3.0, 3.0) and ties.judge.ratings == (8, 8, 3, 3, 3)
    assert chat.judge.cells == (1.0,) * 9 and chat.styles == groups[2].styles
    assert all(r.kind == "judge" and r.mode == "auto" and r.fingerprint == info.fingerprint for r in records.values())
    assert sorted(len(calls) for _, calls in engine.calls) == [1, 5, 18]


async def test_a_classifier_kind_sends_no_judge_fields_so_a_judge_refuses(judge_http):
    from rmserve import errors

    http, _ = judge_http
    async with RewardClient(str(http.make_url("")), session=http.session) as client:
        with pytest.raises(errors.InvalidRequest, match="num_chosen") as info:
            await client.score([rb2_group("Focus", "1")])
    assert info.value.field == "groups[0].num_chosen"


def test_model_info_of_a_judge_decodes_with_its_settings():
    info = msgspec.json.decode(
        b'{"name":"j","max_model_len":8,"dtype":"float32","fingerprint":"f","engine":"vllm","kind":"judge",'
        b'"mode":"ranking","judge_max_tokens":32,"judge_seed":4}', type=ModelInfo)
    assert info.judge_settings() == (32, 4)
