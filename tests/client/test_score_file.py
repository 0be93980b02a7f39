"""The score file (JSONL): round trip, interrupted writes, corruption, duplicates, model checks."""

from __future__ import annotations

import math
import os

import msgspec
import pytest
from rmserve.client import score_file as store_module
from rmserve.client.score_file import ScoreFileWriter, read_scores

from rmserve.errors import DataError, FingerprintMismatch
from rmserve.schema import GroupKey, ScoreRecord


def _record(i: int, *, fingerprint: str = "fp-a", domain: str = "chat") -> ScoreRecord:
    return ScoreRecord(
        benchmark="rm-bench",
        domain=domain,
        id=str(i),
        num_chosen=3,
        rewards=(float(i), 0.5, -1.25, 2.0, 0.0, float(-i)),
        num_tokens=(10, 11, 12, 13, 14, 15),
        num_cached_tokens=(0, 8, 8, 8, 8, 8),
        model="rm-a",
        fingerprint=fingerprint,
    )


def _line(record: ScoreRecord) -> bytes:
    # Written independently of the store: msgspec's own encoder, one object per line.
    return msgspec.json.encode(record) + b"\n"


def test_append_then_read_round_trips_one_line_per_group(tmp_path):
    path = tmp_path / "scores.jsonl"
    records = [_record(i) for i in range(3)]
    with ScoreFileWriter(path) as store:
        for r in records:
            store.append(r)
        assert store.scored_keys() == {GroupKey("rm-bench", "chat", str(i)) for i in range(3)}
    raw = path.read_bytes()
    assert raw == b"".join(_line(r) for r in records)
    back = read_scores(path)
    assert back.records == tuple(records)
    assert (back.model, back.fingerprint, back.dropped_line) == ("rm-a", "fp-a", None)


def test_missing_file_reads_empty(tmp_path):
    back = read_scores(tmp_path / "none.jsonl")
    assert back.records == () and back.fingerprint is None


def test_reopen_resumes_with_the_stored_keys(tmp_path):
    path = tmp_path / "out" / "scores.jsonl"
    with ScoreFileWriter(path) as store:
        store.append(_record(0))
        store.append(_record(1))
    with ScoreFileWriter(path) as store:
        assert store.scored_keys() == {_record(0).key, _record(1).key}
        with pytest.raises(DataError, match="already stored"):
            store.append(_record(1))
        store.append(_record(2))
    assert [r.id for r in read_scores(path).records] == ["0", "1", "2"]


def test_truncated_last_line_is_ignored_reported_and_cut_before_appending(tmp_path):
    path = tmp_path / "scores.jsonl"
    good = _line(_record(0)) + _line(_record(1))
    partial = _line(_record(2))[:37]  # a write interrupted mid-line: no newline
    path.write_bytes(good + partial)

    back = read_scores(path)
    assert [r.id for r in back.records] == ["0", "1"]
    assert back.dropped_line == 3 and back.dropped_bytes == 37
    assert "line 3" in back.dropped_note and "truncated" in back.dropped_note

    with ScoreFileWriter(path) as store:
        assert store.existing.dropped_line == 3
        assert path.read_bytes() == good  # the partial line is gone
        store.append(_record(2))
    assert path.read_bytes() == good + _line(_record(2))


def test_valid_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)).rstrip(b"\n"))
    assert [r.id for r in read_scores(path).records] == ["0"]
    with ScoreFileWriter(path) as store:
        store.append(_record(1))
    assert path.read_bytes() == _line(_record(0)) + _line(_record(1))


def test_corrupt_line_in_the_middle_is_a_data_error_naming_the_line(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)) + b'{"benchmark": "rm-bench", "dom\n' + _line(_record(2)))
    with pytest.raises(DataError, match=r"scores.jsonl, line 2: not a valid score record"):
        read_scores(path)
    with pytest.raises(DataError, match="line 2"):
        ScoreFileWriter(path).open()


def test_complete_but_invalid_last_line_is_not_taken_for_a_truncation(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)) + b"not json\n")
    with pytest.raises(DataError, match="line 2"):
        read_scores(path)


def test_wrong_field_type_names_line_and_field(tmp_path):
    path = tmp_path / "scores.jsonl"
    bad = _line(_record(1)).replace(b'"rewards":[1.0', b'"rewards":["one"')
    path.write_bytes(_line(_record(0)) + bad + _line(_record(2)))
    with pytest.raises(DataError) as info:
        read_scores(path)
    assert info.value.line == 2 and info.value.field == "rewards[0]"


def test_group_stored_twice_is_a_data_error(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)) + _line(_record(1)) + _line(_record(0)))
    with pytest.raises(DataError, match=r"line 3, .*stored twice \(first at line 1\)"):
        read_scores(path)


def test_same_id_in_two_domains_is_two_groups(tmp_path):
    path = tmp_path / "scores.jsonl"
    with ScoreFileWriter(path) as store:
        store.append(_record(0, domain="chat"))
        store.append(_record(0, domain="code"))
    assert len(read_scores(path).records) == 2


def test_mixed_fingerprints_in_a_file_are_a_data_error(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)) + _line(_record(1, fingerprint="fp-b")))
    with pytest.raises(DataError) as info:
        read_scores(path)
    assert info.value.line == 2 and info.value.field == "fingerprint"


def test_fingerprint_mismatch_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "scores.jsonl"
    with ScoreFileWriter(path) as store:
        store.append(_record(0))
        store.append(_record(1))
    with ScoreFileWriter(path) as store:
        assert store.check_model(model="rm-a", fingerprint="fp-a") is False
        with pytest.raises(FingerprintMismatch, match="different model") as info:
            store.check_model(model="rm-b", fingerprint="fp-b")
        assert "fp-a" in str(info.value) and "fp-b" in str(info.value) and "--overwrite" in str(info.value)
        assert len(store.records) == 2
        with pytest.raises(FingerprintMismatch):
            store.append(_record(5, fingerprint="fp-b"))
    assert len(read_scores(path).records) == 2  # refusing changed nothing
    with ScoreFileWriter(path) as store:
        assert store.check_model(model="rm-b", fingerprint="fp-b", overwrite=True) is True
        assert store.scored_keys() == frozenset()
        store.append(_record(7, fingerprint="fp-b"))
    back = read_scores(path)
    assert [r.id for r in back.records] == ["7"] and back.fingerprint == "fp-b"


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "scores.jsonl"
    with ScoreFileWriter(path):
        with pytest.raises(DataError, match="another run"):
            ScoreFileWriter(path).open()
    with ScoreFileWriter(path):  # released on close
        pass


def test_fsync_per_record_when_asked(tmp_path, monkeypatch):
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    with ScoreFileWriter(tmp_path / "a.jsonl", fsync=True) as store:
        for i in range(3):
            store.append(_record(i))
    assert len(calls) == 3
    calls.clear()
    with ScoreFileWriter(tmp_path / "b.jsonl") as store:
        store.append(_record(0))
    assert calls == []


def test_python_json_literals_read_as_the_floats_they_name(tmp_path):
    path = tmp_path / "scores.jsonl"
    line = _line(_record(0)).replace(
        b'"rewards":[0.0,0.5,-1.25,2.0,0.0,0.0]', b'"rewards":[NaN,1e999,-Infinity,2.0,Infinity,0.0]'
    )
    assert line != _line(_record(0))
    path.write_bytes(line + _line(_record(1)))
    back = read_scores(path)
    rewards = back.records[0].rewards
    assert math.isnan(rewards[0])
    assert rewards[1:] == (math.inf, -math.inf, 2.0, math.inf, 0.0)
    assert back.records[1] == _record(1)
    assert back.dropped_line is None


def test_a_complete_but_invalid_last_line_without_newline_is_an_error_not_a_torn_write(tmp_path):
    path = tmp_path / "scores.jsonl"
    bad = _line(_record(1)).replace(b'"rewards":[1.0', b'"rewards":["one"').rstrip(b"\n")
    path.write_bytes(_line(_record(0)) + bad)
    with pytest.raises(DataError) as info:
        read_scores(path)
    assert info.value.line == 2 and info.value.field == "rewards[0]"


def test_torn_last_line_note_names_file_line_and_bytes(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(_line(_record(0)) + _line(_record(1))[:25])
    assert read_scores(path).dropped_note == (
        f"{path}: ignored a truncated last line (line 2, 25 bytes, no newline and not valid JSON: an interrupted "
        "write); its group will be scored again"
    )


def test_byte_order_mark_is_skipped_and_kept_when_repairing(tmp_path):
    path = tmp_path / "scores.jsonl"
    bom = b"\xef\xbb\xbf"
    good = bom + _line(_record(0))
    path.write_bytes(good + _line(_record(1))[:30])
    back = read_scores(path)
    assert [r.id for r in back.records] == ["0"]
    assert back.valid_bytes == len(good)  # counted from the start of the file, mark included
    with ScoreFileWriter(path) as store:
        store.append(_record(1))
    assert path.read_bytes() == good + _line(_record(1))
    assert [r.id for r in read_scores(path).records] == ["0", "1"]


def test_writer_reports_closed_and_refuses_appends_when_closed(tmp_path):
    writer = ScoreFileWriter(tmp_path / "scores.jsonl")
    assert writer.closed
    with writer:
        assert not writer.closed
        writer.append(_record(0))
    assert writer.closed
    with pytest.raises(RuntimeError, match="not open"):
        writer.append(_record(1))
    assert read_scores(tmp_path / "scores.jsonl").records == (_record(0),)
