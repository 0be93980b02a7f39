"""The score store (SQLite): records, batching, duplicates, crash safety, export, checkpoints.

Its use by the pipelines (``eval``, ``run``, the CLI) is tested in
``tests/pipelines/test_store_pipelines.py``."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
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
from testkit.records import fake_checkpoint, score_record

from rmserve import errors
from rmserve.schema import GroupKey, ModelInfo, ResponseError



def _count(path: Path) -> int:
    """Rows committed to the store, read through a separate plain sqlite3 connection."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0]


# --- the store on its own ---------------------------------------------------------------------


def test_records_round_trip_with_missing_rewards_and_optional_fields(tmp_path):
    full = score_record(
        3,
        rewards=(1.25, None, -0.5),
        truncated_tokens=(0, 4, 0),
        styles=("concise", "detailed_plain", "detailed_markdown"),
        errors=(None, ResponseError("sequence_too_long", "5,000 tokens (chat template included), over max_model_len=4,096"), None),
    )
    plain = score_record(1, domain="code")
    other_model = score_record(1, fingerprint="fp-b")
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
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        counts = conn.execute("SELECT fingerprint, model, COUNT(*) FROM scores GROUP BY fingerprint ORDER BY fingerprint")
        assert counts.fetchall() == [("fp-a", "rm-a", 2), ("fp-b", "rm-a", 1)]
        row = conn.execute(
            "SELECT model, rewards, num_tokens, num_cached_tokens, server_version FROM scores "
            "WHERE fingerprint='fp-a' AND domain='chat' AND group_id='3'"
        ).fetchone()
    assert row == ("rm-a", "[1.25,null,-0.5]", "[13,23]", "[3,0]", "0.1.0")


def test_puts_commit_in_batches_and_flush_commits_the_rest(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScoreStore(path, batch_size=4, flush_interval_s=3600) as db:
        for i in range(3):
            db.put(score_record(i))
        assert _count(path) == 0
        with ScoreStore(path) as second:  # another connection: sees only committed rows
            assert second.stored_keys("fp-a") == frozenset()
        db.put(score_record(3))  # the fourth record fills the batch
        assert _count(path) == 4
        db.put(score_record(4))
        db.put(score_record(5))
        assert _count(path) == 4
        db.flush()
        assert _count(path) == 6
        db.put(score_record(6))
    assert _count(path) == 7  # leaving the block commits the buffer


def test_a_waiting_buffer_is_committed_after_flush_interval(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScoreStore(path, batch_size=1000, flush_interval_s=0.05) as db:
        db.put(score_record(0))
        db.put(score_record(1))
        deadline = time.monotonic() + 30
        while _count(path) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _count(path) == 2  # committed by the store's thread, no further put or flush


def test_reads_include_this_objects_buffered_records(tmp_path):
    with ScoreStore(tmp_path / "s.sqlite", batch_size=100, flush_interval_s=3600) as db:
        db.put(score_record(0))
        assert db.stored_keys("fp-a") == {GroupKey("rm-bench", "chat", "0")}


def test_identical_duplicate_is_ignored_and_a_conflicting_one_raises_naming_the_key(tmp_path):
    path = tmp_path / "s.sqlite"
    first = score_record(1)
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
        db.put(score_record(1))
        db.put(score_record(2))
        other.put(score_record(1, rewards=(7.0, 7.0)))  # another writer stores group 1 first
        other.flush()
        with pytest.raises(ScoreConflict, match="rm-bench/chat/1"):
            db.flush()
        assert [r.rewards for r in db.records("fp-a")] == [(7.0, 7.0), score_record(2).rewards]


def test_record_without_fingerprint_is_refused(tmp_path):
    with ScoreStore(tmp_path / "s.sqlite") as db, pytest.raises(ValueError, match="'fingerprint'"):
        db.put(score_record(0, fingerprint=""))


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
    records = [score_record(i, rewards=(i * 0.1, None) if i % 2 else None, styles=("a", "b")) for i in range(5)]
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


def test_checkpoint_signature_follows_the_weights(tmp_path):
    from rmserve.fingerprint import model_fingerprint

    a = fake_checkpoint(tmp_path / "step-1", b"\x00" * 4096)
    b = fake_checkpoint(tmp_path / "step-2", b"\x00" * 4095 + b"\x01")
    a_copy = fake_checkpoint(tmp_path / "elsewhere" / "step-1", b"\x00" * 4096)
    assert checkpoint_signature(a) != checkpoint_signature(b)
    assert checkpoint_signature(a) == checkpoint_signature(a_copy)  # content, not place
    assert checkpoint_signature(a) == model_fingerprint(a, chat_template=None)
    with pytest.raises(ValueError, match="not a folder"):
        checkpoint_signature(tmp_path / "missing")


def test_checkpoint_signature_covers_the_head_and_a_template_override(tmp_path):
    import hashlib

    from rmserve.fingerprint import chat_template_digest, model_fingerprint
    from rmserve.schema import CLASSIFIER_REWARD_HEAD, RewardHead

    a = fake_checkpoint(tmp_path / "step-1", b"\x00" * 4096)
    plain = checkpoint_signature(a, "float32")
    assert checkpoint_signature(a, "float32", head=CLASSIFIER_REWARD_HEAD) == plain  # older memos keep matching
    head = RewardHead("multi-label", label_index=1)
    assert checkpoint_signature(a, "float32", head=head) == model_fingerprint(a, None, "float32", head) != plain
    digest = chat_template_digest("{{ messages }}")
    assert digest == hashlib.sha256(b"{{ messages }}").hexdigest()[:16]
    overridden = checkpoint_signature(a, "float32", chat_template_override=digest)
    # By hand: the plain signature and the digest, each as label NUL length(8, little) value.
    by_hand = hashlib.sha256()
    for label, value in (("signature", plain), ("chat_template_override", digest)):
        by_hand.update(label.encode() + b"\0" + len(value).to_bytes(8, "little") + value.encode())
    assert overridden == by_hand.hexdigest()[:16]
    assert len({plain, overridden, checkpoint_signature(a, "float32", chat_template_override=chat_template_digest("x"))}) == 3


def test_checkpoint_signature_follows_the_folder_s_own_template_files(tmp_path):
    """transformers saves a template as chat_template.jinja (or .json), which the fingerprint's
    tokenizer files leave out; an edited one must not keep the signature a server's fingerprint
    was remembered under."""
    import hashlib

    from rmserve.fingerprint import model_fingerprint

    a = fake_checkpoint(tmp_path / "step-1", b"\x00" * 4096)
    plain = checkpoint_signature(a, "float32")
    assert plain == model_fingerprint(a, None, "float32")  # no template file: the plain hash
    (a / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    first = checkpoint_signature(a, "float32")
    by_hand = hashlib.sha256()
    for label, value in (("signature", plain.encode()), ("template:chat_template.jinja", b"{{ messages }}")):
        by_hand.update(label.encode() + b"\0" + len(value).to_bytes(8, "little") + value)
    assert first == by_hand.hexdigest()[:16]
    (a / "chat_template.jinja").write_text("{{ messages }}\n", encoding="utf-8")
    assert checkpoint_signature(a, "float32") not in (plain, first)
    (a / "chat_template.jinja").unlink()
    (a / "chat_template.json").write_text('{"chat_template": "{{ messages }}"}', encoding="utf-8")
    assert checkpoint_signature(a, "float32") not in (plain, first)


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
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        rows = conn.execute("SELECT signature, path, fingerprint, model FROM checkpoints ORDER BY signature")
        assert rows.fetchall() == [("sig-1", "/ckpt/1", "fp-c", "rm-a"), ("sig-2", "/ckpt/2", "fp-b", "rm-b")]


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
