"""ScoreLog, the owner of resume: score file alone, score store alone, both out of step,
a torn last line, another model's file, and the final rewrite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from rmserve.client.score_log import Resumed, ScoreLog
from rmserve.client.score_store import ScoreConflict, ScoreStore
from testkit.records import score_record
from testkit.servers import make_groups

from rmserve.errors import DataError, FingerprintMismatch
from rmserve.schema import ModelInfo, ScoreRecord

MODEL_A = ModelInfo(name="rm-a", max_model_len=4096, dtype="float32", fingerprint="fp-a", engine="fake")
MODEL_B = ModelInfo(name="rm-b", max_model_len=4096, dtype="float32", fingerprint="fp-b", engine="fake")
GROUPS = make_groups(4)  # rm-bench/chat/0 … rm-bench/chat/3, in this data order


def _line(record: ScoreRecord) -> bytes:
    # Written independently of the score file code: msgspec's own encoder, one object per line.
    return msgspec.json.encode(record) + b"\n"


def _write_file(path: Path, *ids: int, fingerprint: str = "fp-a", model: str = "rm-a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(_line(score_record(i, fingerprint=fingerprint, model=model)) for i in ids))


def _stored_ids(path: Path, fingerprint: str = "fp-a") -> list[str]:
    """Group ids committed to the store under ``fingerprint``, read with plain sqlite3."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT group_id FROM scores WHERE fingerprint = ? ORDER BY group_id", (fingerprint,))
        return [row[0] for row in rows]


def test_resume_from_the_score_file_alone(tmp_path):
    path = tmp_path / "out" / "scores.jsonl"
    _write_file(path, 2, 0)  # file order differs from data order
    with ScoreLog(path) as log:
        resumed = log.resume(MODEL_A, GROUPS)
        assert resumed == Resumed(model=MODEL_A, n_resumed=2, n_from_store=0, n_extra=0)
        assert log.notes == ()
        assert [g.id for g in log.missing()] == ["1", "3"]
        assert log.done_keys() == {GROUPS[0].key, GROUPS[2].key}
        log.append(score_record(3))
        log.append(score_record(1))
        assert [r.id for r in log.records()] == ["0", "1", "2", "3"]
        log.finish()
    # Without a store the file stays as appended: found lines first, then new ones.
    assert path.read_bytes() == b"".join(_line(score_record(i)) for i in (2, 0, 3, 1))


def test_resume_from_the_store_alone_copies_its_groups_into_the_file_in_data_order(tmp_path):
    path = tmp_path / "out" / "scores.jsonl"
    store_path = tmp_path / "s.sqlite"
    with ScoreStore(store_path) as store:
        for i in (3, 0, 1):
            store.put(score_record(i))
        store.put(score_record(2, fingerprint="fp-b", model="rm-b"))  # another model: not for fp-a
        with ScoreLog(path, store=store) as log:
            resumed = log.resume(MODEL_A, GROUPS)
            assert resumed == Resumed(model=MODEL_A, n_resumed=0, n_from_store=3, n_extra=0)
            assert log.notes == (f"answered from the store: 3 groups ({store_path})",)
            assert path.read_bytes() == b"".join(_line(score_record(i)) for i in (0, 1, 3))
            assert [g.id for g in log.missing()] == ["2"]
            log.append(score_record(2), server_version="1.2.3")
            log.finish()
        assert _stored_ids(store_path) == ["0", "1", "2", "3"]
        with sqlite3.connect(store_path) as conn:
            row = conn.execute("SELECT server_version FROM scores WHERE fingerprint='fp-a' AND group_id='2'").fetchone()
        assert row == ("1.2.3",)
    # Finished with a store: the file is rewritten from it, the data's groups in data order.
    assert path.read_bytes() == b"".join(_line(score_record(i)) for i in range(4))


def test_file_missing_groups_the_store_has_gets_them(tmp_path):
    path = tmp_path / "out" / "scores.jsonl"
    _write_file(path, 0)
    with ScoreStore(tmp_path / "s.sqlite") as store:
        store.put(score_record(0))
        store.put(score_record(2))
        with ScoreLog(path, store=store) as log:
            resumed = log.resume(MODEL_A, GROUPS)
            assert (resumed.n_resumed, resumed.n_from_store) == (1, 1)
            assert log.notes == (f"answered from the store: 1 group ({store.path})",)
            assert [g.id for g in log.missing()] == ["1", "3"]
    assert path.read_bytes() == _line(score_record(0)) + _line(score_record(2))


def test_store_missing_groups_the_file_has_gets_them(tmp_path):
    path = tmp_path / "out" / "scores.jsonl"
    _write_file(path, 0, 2)
    store_path = tmp_path / "s.sqlite"
    with ScoreStore(store_path, batch_size=100, flush_interval_s=3600) as store:
        store.put(score_record(0))
        store.flush()
        with ScoreLog(path, store=store) as log:
            resumed = log.resume(MODEL_A, GROUPS)
            assert (resumed.n_resumed, resumed.n_from_store) == (2, 0)
            assert log.notes == (f"added 1 groups of {path} to the score store {store_path}",)
            assert _stored_ids(store_path) == ["0", "2"]  # committed during resume, not at close
            assert [g.id for g in log.missing()] == ["1", "3"]
    assert path.read_bytes() == _line(score_record(0)) + _line(score_record(2))


def test_torn_last_line_is_cut_noted_and_its_group_is_missing(tmp_path):
    path = tmp_path / "scores.jsonl"
    whole = _line(score_record(0)) + _line(score_record(1))
    torn = _line(score_record(2))[:30]
    path.write_bytes(whole + torn)
    with ScoreLog(path) as log:
        assert log.notes == (
            f"{path}: ignored a truncated last line (line 3, 30 bytes, no newline and not valid JSON: an interrupted write); "
            "its group will be scored again",
        )
        assert path.read_bytes() == whole
        resumed = log.resume(MODEL_A, GROUPS)
        assert resumed.n_resumed == 2
        assert [g.id for g in log.missing()] == ["2", "3"]
        log.append(score_record(2))
    assert path.read_bytes() == whole + _line(score_record(2))


def test_another_models_score_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "scores.jsonl"
    _write_file(path, 0, 1)
    before = path.read_bytes()
    with ScoreStore(tmp_path / "s.sqlite") as store, ScoreLog(path, store=store) as log:
        with pytest.raises(FingerprintMismatch, match=r"different model \('rm-a', fingerprint 'fp-a'\).*'rm-b'"):
            log.resume(MODEL_B, GROUPS)
    assert path.read_bytes() == before
    assert _stored_ids(tmp_path / "s.sqlite") == []  # nothing reached the store either


def test_overwrite_discards_another_models_score_file(tmp_path):
    path = tmp_path / "scores.jsonl"
    _write_file(path, 0, 1)
    with ScoreLog(path) as log:
        resumed = log.resume(MODEL_B, GROUPS, overwrite=True)
        assert resumed == Resumed(model=MODEL_B, n_resumed=0, n_from_store=0, n_extra=0)
        assert log.notes == ("--overwrite: discarded 2 stored groups of another model",)
        assert len(log.missing()) == 4
    assert path.read_bytes() == b""


def test_groups_outside_the_data_are_counted_left_out_and_dropped_by_the_rewrite(tmp_path):
    path = tmp_path / "scores.jsonl"
    _write_file(path, 0, 1, 2, 3, 7)
    with ScoreStore(tmp_path / "s.sqlite") as store:
        with ScoreLog(path, store=store) as log:
            resumed = log.resume(MODEL_A, GROUPS[:3])
            assert (resumed.n_resumed, resumed.n_extra) == (3, 2)
            assert [r.id for r in log.records()] == ["0", "1", "2"]
            log.finish()
        assert _stored_ids(tmp_path / "s.sqlite") == ["0", "1", "2", "3", "7"]  # left the file, not the store
    assert path.read_bytes() == b"".join(_line(score_record(i)) for i in range(3))


def test_finish_with_a_group_still_missing_names_it(tmp_path):
    path = tmp_path / "scores.jsonl"
    _write_file(path, 0, 1, 3)
    with ScoreStore(tmp_path / "s.sqlite") as store, ScoreLog(path, store=store) as log:
        log.resume(MODEL_A, GROUPS)
        with pytest.raises(DataError, match="holds 3 of the 4 data groups after the run; group 'rm-bench/chat/2'"):
            log.finish()


def test_file_and_store_disagreeing_is_a_conflict(tmp_path):
    path = tmp_path / "scores.jsonl"
    _write_file(path, 0)
    with ScoreStore(tmp_path / "s.sqlite") as store:
        store.put(msgspec.structs.replace(score_record(0), rewards=(9.0, 9.0)))
        with ScoreLog(path, store=store) as log, pytest.raises(ScoreConflict, match="rm-bench/chat/0"):
            log.resume(MODEL_A, GROUPS)


def test_steps_out_of_order_are_refused(tmp_path):
    log = ScoreLog(tmp_path / "scores.jsonl")
    with pytest.raises(RuntimeError, match="not open"):
        log.resume(MODEL_A, GROUPS)
    with log:
        with pytest.raises(RuntimeError, match=r"resume\(model, groups\) must come first"):
            log.missing()
        with pytest.raises(RuntimeError, match=r"resume\(model, groups\) must come first"):
            log.finish()
    with pytest.raises(RuntimeError, match=r"resume\(model, groups\) must come first"):
        log.append(score_record(0))
    assert (tmp_path / "scores.jsonl").read_bytes() == b""


def test_a_record_of_another_model_is_refused(tmp_path):
    path = tmp_path / "scores.jsonl"
    with ScoreStore(tmp_path / "s.sqlite") as store, ScoreLog(path, store=store) as log:
        log.resume(MODEL_A, GROUPS)
        with pytest.raises(FingerprintMismatch, match=r"'rm-bench/chat/0' has fingerprint 'fp-b'.*'rm-a' has 'fp-a'"):
            log.append(score_record(0, fingerprint="fp-b", model="rm-b"))
        assert [g.id for g in log.missing()] == ["0", "1", "2", "3"]
    assert path.read_bytes() == b""
    assert _stored_ids(tmp_path / "s.sqlite", "fp-b") == []
