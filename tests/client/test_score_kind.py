"""What kind of score a record holds (classifier or DPO) and the engine's extras: from the
reply into the record, through the score file and the score store (old stores migrate), and
the refusal to resume a DPO score file under another mode."""

from __future__ import annotations

import sqlite3

import msgspec
import pytest
from rmserve.client.client import RewardClient
from rmserve.client.records import record_from_result
from rmserve.client.score_file import ScoreFileWriter, read_scores
from rmserve.client.score_log import ScoreLog
from rmserve.client.score_store import SCHEMA_VERSION, ScoreStore
from testkit import wire_stub
from testkit.records import score_record
from testkit.servers import make_groups

from rmserve import errors
from rmserve.schema import GroupResult, ModelInfo, ScoreKind, ScoreRecord, encode

CLASSIFIER_LINE = (
    b'{"benchmark":"rm-bench","domain":"chat","id":"3","num_chosen":1,"rewards":[3.5,-3.25],'
    b'"num_tokens":[13,23],"num_cached_tokens":[3,0],"model":"rm-a","fingerprint":"fp-a"}'
)
"""A classifier record of group 3 (``testkit.records.score_record(3)``) as score files held it
before records knew their kind: every new field must be left out."""

DPO_EXTRAS = {
    "policy_logp": (-12.5, -20.0),
    "ref_logp": (-14.0, -18.5),
    "policy_logp_norm": (3.25, 4.5),
    "answer_tokens": (5, 8),
}
DPO_KIND = ScoreKind(kind="dpo", mode="reference", ref_model="ref-7b", compat="official")


def _dpo_record(i: int, *, fingerprint: str = "fp-dpo-ref", kind: ScoreKind = DPO_KIND, **extra) -> ScoreRecord:
    return score_record(
        i, fingerprint=fingerprint, model="policy-7b", rewards=(1.5, -1.5), extras=DPO_EXTRAS,
        kind=kind.kind, mode=kind.mode, ref_model=kind.ref_model, compat=kind.compat, **extra,
    )


def _info(fingerprint: str, kind: ScoreKind) -> ModelInfo:
    return ModelInfo(
        name="policy-7b", max_model_len=4096, dtype="float32", fingerprint=fingerprint, engine="stub",
        kind=kind.kind, mode=kind.mode, ref_model=kind.ref_model, compat=kind.compat,
    )


# --- the record ---------------------------------------------------------------------------


def test_classifier_record_encodes_byte_for_byte_as_before():
    assert encode(score_record(3)) == CLASSIFIER_LINE
    group = make_groups(4)[3]
    result = GroupResult(id=str(group.key), rewards=(3.5, -3.25), num_tokens=(13, 23), num_cached_tokens=(3, 0))
    info = ModelInfo(name="rm-a", max_model_len=512, dtype="float32", fingerprint="fp-a", engine="stub")
    record = record_from_result(group, result, model="rm-a", fingerprint="fp-a", kind=ScoreKind.of(info))
    assert record.score_kind == ScoreKind()
    assert b'"kind"' not in encode(record) and b'"extras"' not in encode(record)


def test_classifier_score_file_and_store_export_are_unchanged(tmp_path):
    with ScoreFileWriter(tmp_path / "scores.jsonl") as writer:
        writer.append(score_record(3))
    assert (tmp_path / "scores.jsonl").read_bytes() == CLASSIFIER_LINE + b"\n"
    with ScoreStore(tmp_path / "s.sqlite") as store:
        store.put(score_record(3))
        store.export_jsonl(tmp_path / "export.jsonl", "fp-a")
    assert (tmp_path / "export.jsonl").read_bytes() == CLASSIFIER_LINE + b"\n"


def test_record_from_result_keeps_the_extras_and_the_kind():
    group = make_groups(1)[0]
    result = GroupResult(id=str(group.key), rewards=(1.5, -1.5), num_tokens=(9, 12), num_cached_tokens=(0, 0),
                         extras=DPO_EXTRAS)
    record = record_from_result(group, result, model="policy-7b", fingerprint="fp-dpo-ref", kind=DPO_KIND)
    assert record.extras == DPO_EXTRAS
    assert (record.kind, record.mode, record.ref_model, record.compat) == ("dpo", "reference", "ref-7b", "official")
    assert msgspec.json.decode(encode(record), type=ScoreRecord) == record


def test_score_kind_describes_itself():
    assert ScoreKind().describe() == "classifier"
    assert DPO_KIND.describe() == "dpo (mode reference, reference 'ref-7b', compat official)"
    assert ScoreKind(kind="dpo", mode="avg").describe() == "dpo (mode avg, compat none)"


# --- score file and store -----------------------------------------------------------------


def test_dpo_records_round_trip_through_the_score_file(tmp_path):
    path = tmp_path / "scores.jsonl"
    records = [_dpo_record(i) for i in range(3)]
    with ScoreFileWriter(path) as writer:
        for record in records:
            writer.append(record)
    assert read_scores(path).records == tuple(records)
    line = path.read_bytes().splitlines()[0]
    assert b'"extras":{"policy_logp":[-12.5,-20.0],"ref_logp":[-14.0,-18.5]' in line
    assert line.endswith(b',"kind":"dpo","mode":"reference","ref_model":"ref-7b","compat":"official"}')


def test_dpo_records_round_trip_through_the_store_with_their_columns(tmp_path):
    path = tmp_path / "s.sqlite"
    records = [_dpo_record(i) for i in range(2)] + [_dpo_record(7, fingerprint="fp-dpo-avg", kind=ScoreKind("dpo", "avg"))]
    with ScoreStore(path) as store:
        for record in records:
            store.put(record)
        assert store.records("fp-dpo-ref") == records[:2]
        assert store.records("fp-dpo-avg") == records[2:]
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT group_id, kind, mode, ref_model, compat, extras FROM scores ORDER BY group_id"
        ).fetchall()
    extras_json = msgspec.json.encode(DPO_EXTRAS).decode()
    assert rows == [
        ("0", "dpo", "reference", "ref-7b", "official", extras_json),
        ("1", "dpo", "reference", "ref-7b", "official", extras_json),
        ("7", "dpo", "avg", None, "none", extras_json),
    ]


_V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE scores (
    fingerprint TEXT NOT NULL, benchmark TEXT NOT NULL, domain TEXT NOT NULL, group_id TEXT NOT NULL,
    model TEXT NOT NULL, num_chosen INTEGER NOT NULL, rewards TEXT NOT NULL, num_tokens TEXT NOT NULL,
    num_cached_tokens TEXT NOT NULL, record TEXT NOT NULL, server_version TEXT NOT NULL, scored_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, benchmark, domain, group_id)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
    signature TEXT PRIMARY KEY, path TEXT NOT NULL, fingerprint TEXT NOT NULL, model TEXT NOT NULL,
    model_info TEXT, seen_at REAL NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def _v1_store(path) -> None:
    """A store as the first table layout (version 1) wrote it, holding group 3 of ``fp-a``."""
    with sqlite3.connect(path) as conn:
        conn.executescript(_V1_SCHEMA)
        conn.execute(
            "INSERT INTO scores VALUES ('fp-a', 'rm-bench', 'chat', '3', 'rm-a', 1, '[3.5,-3.25]', '[13,23]', '[3,0]', ?, "
            "'0.1', 1.0)",
            (CLASSIFIER_LINE.decode(),),
        )
    conn.close()


def test_an_old_store_is_migrated_and_keeps_working(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_store(path)
    assert SCHEMA_VERSION == 3
    with ScoreStore(path) as store:
        assert store.records("fp-a") == [score_record(3)]
        assert store.stored_keys("fp-a") == {score_record(3).key}
        store.put(score_record(3))  # the same answer again: accepted, ignored
        store.put(_dpo_record(4))
        assert store.records("fp-dpo-ref") == [_dpo_record(4)]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
        rows = conn.execute("SELECT group_id, kind, mode, ref_model, compat, extras, judge_protocol, "
                            "judge_parse_failures FROM scores ORDER BY group_id").fetchall()
    assert rows[0] == ("3", "classifier", None, None, "none", None, None, None)
    assert rows[1][:5] == ("4", "dpo", "reference", "ref-7b", "official")
    with ScoreStore(path) as store:  # opening a migrated store again changes nothing
        assert len(store.records("fp-a")) == 1


def test_a_store_newer_than_this_rmserve_is_still_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    ScoreStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(errors.DataError, match=r"version '4' is not one this rmserve reads \(it reads versions 1 to 3\)"):
        ScoreStore(path)


# --- resume -------------------------------------------------------------------------------


def test_a_dpo_score_file_refuses_to_resume_under_another_mode(tmp_path):
    path = tmp_path / "scores.jsonl"
    groups = make_groups(2)
    reference = _info("fp-dpo-ref", DPO_KIND)
    with ScoreLog(path) as log:
        log.resume(reference, groups)
        log.append(_dpo_record(0))
    avg = _info("fp-dpo-avg", ScoreKind(kind="dpo", mode="avg"))
    with ScoreLog(path) as log:
        with pytest.raises(errors.FingerprintMismatch) as info:
            log.resume(avg, groups)
    assert str(info.value) == (
        f"{path} holds scores of a different model ('policy-7b', fingerprint 'fp-dpo-ref', dpo (mode reference, "
        "reference 'ref-7b', compat official)) than the server's ('policy-7b', fingerprint 'fp-dpo-avg', dpo (mode avg, "
        "compat none)). What is stored here (1 group) stays valid for fingerprint 'fp-dpo-ref': to resume it, run the "
        "same command again once the server serves that checkpoint again (an admin loads it: rmserve models load); "
        "to score the server's model, use another output folder. --overwrite discards them"
    )
    with ScoreLog(path) as log:  # the same mode resumes
        assert log.resume(reference, groups).n_resumed == 1


def test_a_classifier_refusal_reads_as_before(tmp_path):
    path = tmp_path / "scores.jsonl"
    with ScoreFileWriter(path) as writer:
        writer.append(score_record(0))
        with pytest.raises(errors.FingerprintMismatch) as info:
            writer.check_model(model="rm-b", fingerprint="fp-b")
    assert "fingerprint 'fp-a') than the server's ('rm-b', fingerprint 'fp-b'). What is stored here (1 group)" in str(info.value)


# --- through the wire -----------------------------------------------------------------------


async def test_a_dpo_server_s_extras_reach_the_records(stub_http, stub_state):
    stub_state.model = wire_stub.stub_dpo_model("reference", ref_model="ref-7b")
    groups = make_groups(3)
    async with RewardClient(str(stub_http.make_url("")), session=stub_http.session) as client:
        records = [r async for r in client.score_stream(groups, kind=ScoreKind.of(stub_state.model))]
    assert len(records) == 3
    for record in records:
        group = next(g for g in groups if g.key == record.key)
        mode_extras = [wire_stub.stub_dpo_extras(r, "reference") for r in group.responses]
        assert record.extras == {name: tuple(e[name] for e in mode_extras) for name in mode_extras[0]}
        assert record.rewards == tuple(e["policy_logp"] - e["ref_logp"] for e in mode_extras)
        assert record.score_kind == ScoreKind(kind="dpo", mode="reference", ref_model="ref-7b", compat="none")


async def test_extras_of_the_wrong_length_are_a_server_fault(stub_http, stub_state):
    stub_state.model = wire_stub.stub_dpo_model("sum")

    def tamper(request, results):
        return [msgspec.structs.replace(r, extras={**r.extras, "answer_tokens": r.extras["answer_tokens"][:1]})
                for r in results]

    stub_state.reply_tamper = tamper
    group = make_groups(1)[0]
    async with RewardClient(str(stub_http.make_url("")), session=stub_http.session) as client:
        with pytest.raises(errors.ServerFault, match=r"has 1 extras\['answer_tokens'\] values for 6 responses") as info:
            await client.score([group])
    assert info.value.field == f"results[{group.key}].extras.answer_tokens"
