"""The score store: every scored group of every model, in one SQLite file, across runs.

``OUT/scores.jsonl`` (:mod:`rmserve.client.score_file`) is the resumable file of one run and one
model. The score store keeps the records of all runs, keyed by model fingerprint and group
(``fingerprint, benchmark, domain, id``), so a model already scored on a group is never asked
again — by a rerun into another output folder, by ``rmserve run`` of a checkpoint seen before,
or by a sweep over checkpoints. Keeping a run's score file and the store in step is
:class:`~rmserve.client.score_log.ScoreLog`'s job.

Storage: stdlib :mod:`sqlite3` in WAL mode (``synchronous=NORMAL``, ``busy_timeout`` 30 s), so
several processes may read and write one store at once. :meth:`ScoreStore.put` buffers records
and commits them in one transaction when ``batch_size`` are buffered or ``flush_interval_s``
has passed since the last commit (a background thread commits a waiting buffer on time). A
process killed with SIGKILL loses at most that uncommitted buffer; committed rows survive,
and the file stays consistent (SQLite's journal).

Tables:

- ``scores``: one row per (fingerprint, benchmark, domain, group_id): ``model``,
  ``num_chosen``, ``rewards`` / ``num_tokens`` / ``num_cached_tokens`` (JSON arrays), the whole
  :class:`~rmserve.schema.ScoreRecord` as JSON (``record``, the source of truth on read),
  ``server_version``, ``scored_at`` (Unix seconds) and, since version 2, what kind of score the
  rewards are — ``kind`` (``classifier``/``dpo``), ``mode``, ``ref_model``, ``compat`` — and the
  engine's per-response ``extras`` (JSON object, or NULL), copied from the record so they can be
  queried in SQL; since version 3, for a generative judge's record, ``judge_protocol`` (the
  group's protocol, e.g. ``rb2-ranking``) and ``judge_parse_failures`` (its calls whose output
  gave no verdict or rating), both NULL for other kinds. The judge's calls and texts are in
  ``record`` (the whole record, read back unchanged).
- ``checkpoints``: checkpoint folder signature → the fingerprint a server reported for it
  (``signature`` primary key, ``path``, ``fingerprint``, ``model``, ``model_info`` JSON or
  NULL, ``seen_at`` Unix seconds).
- ``meta``: ``schema_version`` (:data:`SCHEMA_VERSION`). A store written by a newer rmserve
  (higher version) is refused with :class:`StoreVersionError`; an older one is migrated when
  opened, in the transaction that reads its version (version 1 → 2: the five columns above are
  added, existing rows get the classifier defaults ``kind='classifier'``, ``compat='none'``,
  NULL ``mode``/``ref_model``/``extras``, which is what their records say; version 2 → 3: the two
  judge columns are added, NULL for existing rows, which held no judge record).

The store location is :func:`default_store_path` (``$RMSERVE_STORE``, else the XDG data
folder); ``rmserve eval`` / ``rmserve run`` use a store only when given ``--store`` or when
``$RMSERVE_STORE`` is set (:func:`configured_store_path`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Self

import msgspec

from rmserve.errors import DataError
from rmserve.schema import GroupKey, ModelInfo, RewardHead, ScoreRecord, encode

logger = logging.getLogger("rmserve.client")

STORE_ENV = "RMSERVE_STORE"
"""Environment variable naming the score store file."""

SCHEMA_VERSION = 3
"""Version of the tables this module writes (``meta.schema_version``): 1 the first layout; 2 adds
``scores.kind``, ``mode``, ``ref_model``, ``compat`` and ``extras``; 3 adds
``scores.judge_protocol`` and ``judge_parse_failures``."""

BUSY_TIMEOUT_MS = 30_000
"""How long a connection waits for another process's write lock, milliseconds."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS scores (
    fingerprint TEXT NOT NULL,
    benchmark TEXT NOT NULL,
    domain TEXT NOT NULL,
    group_id TEXT NOT NULL,
    model TEXT NOT NULL,
    num_chosen INTEGER NOT NULL,
    rewards TEXT NOT NULL,
    num_tokens TEXT NOT NULL,
    num_cached_tokens TEXT NOT NULL,
    record TEXT NOT NULL,
    server_version TEXT NOT NULL,
    scored_at REAL NOT NULL,
    kind TEXT NOT NULL DEFAULT 'classifier',
    mode TEXT,
    ref_model TEXT,
    compat TEXT NOT NULL DEFAULT 'none',
    extras TEXT,
    judge_protocol TEXT,
    judge_parse_failures INTEGER,
    PRIMARY KEY (fingerprint, benchmark, domain, group_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    signature TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    model TEXT NOT NULL,
    model_info TEXT,
    seen_at REAL NOT NULL
);
"""

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE scores ADD COLUMN kind TEXT NOT NULL DEFAULT 'classifier'",
        "ALTER TABLE scores ADD COLUMN mode TEXT",
        "ALTER TABLE scores ADD COLUMN ref_model TEXT",
        "ALTER TABLE scores ADD COLUMN compat TEXT NOT NULL DEFAULT 'none'",
        "ALTER TABLE scores ADD COLUMN extras TEXT",
    ),
    2: (
        "ALTER TABLE scores ADD COLUMN judge_protocol TEXT",
        "ALTER TABLE scores ADD COLUMN judge_parse_failures INTEGER",
    ),
}
"""Version → the statements that bring a store of that version to the next one."""

_INSERT = (
    "INSERT INTO scores (fingerprint, benchmark, domain, group_id, model, num_chosen, rewards, num_tokens, "
    "num_cached_tokens, record, server_version, scored_at, kind, mode, ref_model, compat, extras, judge_protocol, "
    "judge_parse_failures) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_SELECT_REWARDS = "SELECT rewards FROM scores WHERE fingerprint = ? AND benchmark = ? AND domain = ? AND group_id = ?"

_json = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(ScoreRecord)


class StoreVersionError(DataError):
    """The score store was written with a newer (or unknown) table layout than this rmserve's."""

    type = "store_version"


class ScoreConflict(DataError, ValueError):
    """A group is stored with other rewards than the ones being put, under the same fingerprint.

    A model with one fingerprint must give one reward per response; a second, different
    answer means the fingerprint does not identify the model (or the engine is not
    deterministic) and neither answer can be trusted silently. ``key`` is the group.
    """

    type = "score_conflict"

    def __init__(self, message: str, *, key: GroupKey, fingerprint: str, path: str | None = None) -> None:
        super().__init__(message, path=path, record_id=str(key), field="rewards")
        self.key = key
        self.fingerprint = fingerprint


def default_store_path() -> Path:
    """Where the score store lives when none is named.

    ``$RMSERVE_STORE`` if set (and non-empty), else ``$XDG_DATA_HOME/rmserve/scores.sqlite``,
    else ``~/.local/share/rmserve/scores.sqlite`` (the XDG default data folder).
    """
    named = os.environ.get(STORE_ENV)
    if named:
        return Path(named).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME")
    base = Path(data_home).expanduser() if data_home else Path.home() / ".local" / "share"
    return base / "rmserve" / "scores.sqlite"


def configured_store_path() -> Path | None:
    """The store ``rmserve eval`` / ``run`` use without ``--store``: ``$RMSERVE_STORE``, else None (no store)."""
    named = os.environ.get(STORE_ENV)
    return Path(named).expanduser() if named else None


TEMPLATE_FILES: tuple[str, ...] = ("chat_template.jinja", "chat_template.json")
"""A checkpoint folder's own chat template files, as transformers saves them (read by
:func:`checkpoint_signature`)."""


def checkpoint_signature(
    path: str | Path,
    dtype: str | None = None,
    *,
    head: RewardHead | None = None,
    chat_template_override: str | None = None,
) -> str:
    """Content hash of a local checkpoint folder scored in ``dtype``, without loading it.

    Exactly :func:`rmserve.fingerprint.model_fingerprint` of the folder with no chat
    template: config, weight index, weight files (size + sampled content), tokenizer files,
    the compute dtype (``float32``, ``bfloat16`` …; give the dtype the server reports, since the
    same weights in another dtype give other rewards) and the reward ``head`` the server reads
    (:class:`~rmserve.schema.RewardHead`, as ``ModelInfo.head`` reports it; None and the
    one-label classifier's add nothing, so those signatures keep their values).
    That hash is hashed again with the folder's own template files (``chat_template.jinja``,
    ``chat_template.json``: transformers saves the template there, outside the tokenizer files
    the fingerprint reads, and the server renders with it) and, when given, with
    ``chat_template_override`` (``ModelInfo.chat_template_override``: the server renders every
    checkpoint with a template given at its start), so an edited template or another one never
    shares a signature; a folder with neither keeps the plain hash.
    It is *not* the fingerprint a server reports (that one includes the chat template used);
    :meth:`ScoreStore.remember_checkpoint` maps one to the other.

    Raises:
        ValueError: ``path`` is not a folder (names the path).
        rmserve.errors.ServerFault: the folder has no ``config.json``.
    """
    from rmserve.fingerprint import hash_sections, model_fingerprint

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"checkpoint path {str(path)!r} is not a folder")
    signature = model_fingerprint(folder, chat_template=None, dtype=dtype, head=head)
    sections = [("signature", signature.encode())]
    for name in TEMPLATE_FILES:
        if (folder / name).is_file():
            sections.append((f"template:{name}", (folder / name).read_bytes()))
    if chat_template_override is not None:
        sections.append(("chat_template_override", chat_template_override.encode()))
    if len(sections) == 1:
        return signature
    return hash_sections(sections)


_DELETE = "DELETE FROM scores WHERE fingerprint = ? AND benchmark = ? AND domain = ? AND group_id = ?"


def _unscored(rewards_json: bytes) -> bool:
    """Whether stored rewards hold a null (a response that could not be scored)."""
    return None in msgspec.json.decode(rewards_json)


def _rewards_json(record: ScoreRecord) -> bytes:
    # NaN/inf encode as null, exactly as in the stored record, so equal answers compare equal.
    return _json.encode(record.rewards)


def _judge_columns(record: ScoreRecord) -> tuple[str | None, int | None]:
    """``(judge_protocol, judge_parse_failures)`` of a record: the judge's protocol and how many
    of its calls gave no verdict or rating; (None, None) without a judge record."""
    if record.judge is None:
        return None, None
    return record.judge.protocol, sum(1 for call in record.judge.calls if not call.parse.ok)


def _key_text(fingerprint: str, key: GroupKey) -> str:
    return f"{str(key)!r} (fingerprint {fingerprint!r})"


class ScoreStore:
    """A score store file, open for reading and writing (one connection, thread-safe).

    ``with ScoreStore(path) as store:`` opens (creating the folder and tables if missing), and on
    exit commits the buffer and closes.

    Args:
        path: the SQLite file.
        batch_size: records buffered by :meth:`put` before one transaction commits them.
            Default 64; ≥ 1.
        flush_interval_s: longest time a put record waits for its commit, seconds. Default 1;
            finite, > 0.

    Reads (:meth:`stored_keys`, :meth:`records`, :meth:`export_jsonl`, :meth:`fingerprint_for`,
    :meth:`model_info_for`) commit this object's buffer first, so they see every record put so
    far.

    Raises:
        ValueError: bad ``batch_size`` or ``flush_interval_s`` (names the field).
        StoreVersionError: the file was written by a newer rmserve.
        rmserve.errors.DataError: the file is not an SQLite database (names the path).
    """

    def __init__(self, path: str | Path, *, batch_size: int = 64, flush_interval_s: float = 1.0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        if (
            isinstance(flush_interval_s, bool)
            or not isinstance(flush_interval_s, (int, float))
            or not math.isfinite(flush_interval_s)
            or flush_interval_s <= 0
        ):
            raise ValueError(f"flush_interval_s must be a finite number of seconds > 0, got {flush_interval_s!r}")
        self.path = Path(path)
        self.batch_size = batch_size
        self.flush_interval_s = float(flush_interval_s)
        self._lock = threading.RLock()
        self._buffer: dict[tuple[str, GroupKey], tuple[ScoreRecord, bytes, str, float]] = {}
        self._last_commit = time.monotonic()
        self._background_error: BaseException | None = None
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._open()

    # --- lifecycle ----------------------------------------------------------------------

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise DataError(f"cannot switch the score store to WAL mode (journal mode {mode!r})", path=str(self.path))
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
                ).fetchone() and conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if not row:  # a new store (tables created), or tables without a version row
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    columns = {info[1] for info in conn.execute("PRAGMA table_info(scores)")}
                    row = (str(3 if "judge_protocol" in columns else 2 if "kind" in columns else 1),)
                    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", row)
                self._migrate(conn, self._check_version(row[0]))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise DataError(f"not a usable SQLite score store ({exc})", path=str(self.path)) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        """Bring a store of ``version`` to :data:`SCHEMA_VERSION` (inside the open transaction)."""
        if version == SCHEMA_VERSION:
            return
        for step in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[step]:
                conn.execute(statement)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        logger.info("score store %s: tables migrated from version %d to %d", self.path, version, SCHEMA_VERSION)

    def _check_version(self, value: str) -> int:
        """The store's version as a number.

        Raises:
            StoreVersionError: not a version this rmserve reads (newer, or not a number ≥ 1).
        """
        try:
            version = int(value)
        except (TypeError, ValueError):
            version = None
        if version is None or version > SCHEMA_VERSION or version < 1:
            raise StoreVersionError(
                f"score store schema version {value!r} is not one this rmserve reads (it reads versions 1 to "
                f"{SCHEMA_VERSION}); the store was written by a newer rmserve: upgrade rmserve or use another store",
                path=str(self.path),
                field="schema_version",
                value=value,
                limit=SCHEMA_VERSION,
            )
        return version

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_exc:  # noqa: BLE001 - keep the error already on its way out
            logger.warning("score store %s: could not commit the last records: %s", self.path, close_exc)

    def close(self) -> None:
        """Commit the buffer, stop the flush thread and close the connection; idempotent.

        Raises:
            ScoreConflict: as :meth:`flush` (the store is closed all the same).
        """
        try:
            with self._lock:
                if self._conn is not None:
                    self._raise_background_error()
                    self._commit_locked()
        finally:
            self._stop.set()
            flusher = self._flusher
            if flusher is not None and flusher is not threading.current_thread():
                flusher.join()
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._buffer.clear()

    def _require_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"score store {self.path} is closed")
        return self._conn

    # --- writing ------------------------------------------------------------------------

    def put(self, record: ScoreRecord, *, server_version: str = "") -> None:
        """Store ``record`` under ``(record.fingerprint, benchmark, domain, id)``.

        Buffered; the buffer is committed in one transaction once ``batch_size`` records wait
        or ``flush_interval_s`` has passed since the last commit. A key already stored (or
        buffered) with equal rewards is ignored (the first record stays). A stored group that
        could not be scored (a null reward) is replaced by a new answer for it.

        Raises:
            ValueError: ``record.fingerprint`` is empty (field ``fingerprint``).
            ScoreConflict: the key is stored with different rewards (a ValueError naming the
                key; the record is not stored).
        """
        if not record.fingerprint:
            raise ValueError(f"record {str(record.key)!r}: field 'fingerprint' must be non-empty to store it")
        rewards = _rewards_json(record)
        with self._lock:
            self._raise_background_error()
            conn = self._require_open()
            bkey = (record.fingerprint, record.key)
            buffered = self._buffer.get(bkey)
            if buffered is not None:
                self._check_same(record.fingerprint, record.key, buffered[1], rewards)
                return
            row = conn.execute(_SELECT_REWARDS, (record.fingerprint, record.benchmark, record.domain, record.id)).fetchone()
            if row is not None and row[0].encode() != rewards and _unscored(row[0].encode()):
                # The stored answer is a group that could not be scored (a null reward); the
                # group was scored again (other options): the new answer replaces it.
                conn.execute(_DELETE, (record.fingerprint, record.benchmark, record.domain, record.id))
                conn.commit()
                row = None
            if row is not None:
                self._check_same(record.fingerprint, record.key, row[0].encode(), rewards)
                return
            self._buffer[bkey] = (record, rewards, server_version, time.time())
            if len(self._buffer) >= self.batch_size or time.monotonic() - self._last_commit >= self.flush_interval_s:
                self._commit_locked()
            else:
                self._ensure_flusher()

    def _check_same(self, fingerprint: str, key: GroupKey, stored: bytes, rewards: bytes) -> None:
        if stored != rewards:
            raise ScoreConflict(
                f"group {_key_text(fingerprint, key)} is stored with rewards {stored.decode()}, "
                f"now given {rewards.decode()}; one model must not give two answers",
                key=key,
                fingerprint=fingerprint,
                path=str(self.path),
            )

    def flush(self) -> None:
        """Commit the buffered records now (one transaction).

        Raises:
            ScoreConflict: another process stored one of the buffered keys with different
                rewards meanwhile; the other records are committed, that one is not.
        """
        with self._lock:
            self._raise_background_error()
            if self._conn is not None:
                self._commit_locked()

    def _raise_background_error(self) -> None:
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error

    def _commit_locked(self) -> None:
        conn = self._require_open()
        if not self._buffer:
            return
        entries = list(self._buffer.values())
        conflicts: list[ScoreConflict] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for record, rewards, server_version, scored_at in entries:
                cursor = conn.execute(
                    _INSERT,
                    (
                        record.fingerprint, record.benchmark, record.domain, record.id, record.model, record.num_chosen,
                        rewards.decode(), _json.encode(record.num_tokens).decode(),
                        _json.encode(record.num_cached_tokens).decode(), encode(record).decode(), server_version,
                        scored_at, record.kind, record.mode, record.ref_model, record.compat,
                        _json.encode(record.extras).decode() if record.extras is not None else None,
                        *_judge_columns(record),
                    ),
                )
                if cursor.rowcount == 0:  # stored by another process since put()
                    row = conn.execute(
                        _SELECT_REWARDS, (record.fingerprint, record.benchmark, record.domain, record.id)
                    ).fetchone()
                    try:
                        self._check_same(record.fingerprint, record.key, row[0].encode(), rewards)
                    except ScoreConflict as exc:
                        conflicts.append(exc)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._buffer.clear()
        self._last_commit = time.monotonic()
        if conflicts:
            raise conflicts[0]

    def _ensure_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_on_time, name="rmserve-score-store-flush", daemon=True)
            self._flusher.start()

    def _flush_on_time(self) -> None:
        """Background thread: commit a waiting buffer once ``flush_interval_s`` has passed."""
        wait_s = self.flush_interval_s
        while not self._stop.wait(wait_s):
            with self._lock:
                if self._conn is None:
                    return
                due_s = self._last_commit + self.flush_interval_s - time.monotonic()
                if self._buffer and due_s <= 0 and self._background_error is None:
                    try:
                        self._commit_locked()
                    except Exception as exc:  # noqa: BLE001 - raised by the next put/flush
                        self._background_error = exc
                    due_s = self.flush_interval_s
                wait_s = max(due_s, 0.01) if self._buffer else self.flush_interval_s

    def remember_checkpoint(
        self, signature: str, *, path: str, fingerprint: str, model: str, info: ModelInfo | None = None
    ) -> None:
        """Record that the checkpoint folder with ``signature`` is served as ``fingerprint``.

        Committed at once; a signature seen before is updated (path, model, time).

        Args:
            signature: :func:`checkpoint_signature` of the folder.
            path: the folder, as the server loaded it (kept for people reading the store;
                lookups go by ``signature``).
            fingerprint, model: what the server reported for it.
            info: optionally the server's whole :class:`~rmserve.schema.ModelInfo`, kept so a
                run answered from the store can report it (:meth:`model_info_for`).

        Raises:
            ValueError: an empty ``signature`` or ``fingerprint`` (names the field).
        """
        for name, value in (("signature", signature), ("fingerprint", fingerprint)):
            if not value:
                raise ValueError(f"{name} must be non-empty to remember a checkpoint")
        with self._lock:
            conn = self._require_open()
            conn.execute(
                "INSERT INTO checkpoints (signature, path, fingerprint, model, model_info, seen_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (signature) DO UPDATE SET path = excluded.path, fingerprint = excluded.fingerprint, "
                "model = excluded.model, model_info = excluded.model_info, seen_at = excluded.seen_at",
                (signature, str(path), fingerprint, model, encode(info).decode() if info is not None else None, time.time()),
            )

    # --- reading ------------------------------------------------------------------------

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            self._raise_background_error()
            self._commit_locked()
            return self._require_open().execute(sql, params).fetchall()

    def fingerprint_for(self, signature: str) -> str | None:
        """The fingerprint remembered for a checkpoint signature, or None."""
        rows = self._read("SELECT fingerprint FROM checkpoints WHERE signature = ?", (signature,))
        return rows[0][0] if rows else None

    def model_info_for(self, signature: str) -> ModelInfo | None:
        """The :class:`~rmserve.schema.ModelInfo` remembered for a checkpoint signature.

        None when the signature is unknown. When it was remembered without ``info``, a
        ModelInfo with the stored name and fingerprint and ``engine="unknown"``,
        ``dtype="unknown"``, ``max_model_len=0``.
        """
        rows = self._read("SELECT fingerprint, model, model_info FROM checkpoints WHERE signature = ?", (signature,))
        if not rows:
            return None
        fingerprint, model, info = rows[0]
        if info is not None:
            return msgspec.json.decode(info, type=ModelInfo)
        return ModelInfo(name=model, max_model_len=0, dtype="unknown", fingerprint=fingerprint, engine="unknown")

    def stored_keys(self, fingerprint: str, benchmark: str | None = None) -> frozenset[GroupKey]:
        """Keys of the groups stored under ``fingerprint`` (of ``benchmark`` only, when given)."""
        sql = "SELECT benchmark, domain, group_id FROM scores WHERE fingerprint = ?"
        params: tuple = (fingerprint,)
        if benchmark is not None:
            sql += " AND benchmark = ?"
            params += (benchmark,)
        return frozenset(GroupKey(b, d, i) for b, d, i in self._read(sql, params))

    def records(
        self, fingerprint: str, *, benchmark: str | None = None, keys: Iterable[GroupKey] | None = None
    ) -> list[ScoreRecord]:
        """The stored records of ``fingerprint``, sorted by (benchmark, domain, id).

        ``benchmark`` and ``keys`` narrow the selection; keys not stored are absent from the
        result (compare its length).
        """
        sql = "SELECT record FROM scores WHERE fingerprint = ?"
        params: tuple = (fingerprint,)
        if benchmark is not None:
            sql += " AND benchmark = ?"
            params += (benchmark,)
        found = [_record_decoder.decode(row[0]) for row in self._read(sql, params)]
        if keys is not None:
            wanted = set(keys)
            found = [r for r in found if r.key in wanted]
        found.sort(key=lambda r: (r.benchmark, r.domain, r.id))
        return found

    def export_jsonl(
        self,
        path: str | Path,
        fingerprint: str,
        *,
        benchmark: str | None = None,
        keys: Iterable[GroupKey] | None = None,
    ) -> int:
        """Write stored records as a score file (:mod:`rmserve.client.score_file` format), atomically.

        One :class:`~rmserve.schema.ScoreRecord` per line (:func:`rmserve.schema.encode`), in
        the order of ``keys`` when given (keys not stored are left out: compare the returned
        count), else sorted by (benchmark, domain, id). Written to a temporary file in the same
        folder, fsynced, then renamed over ``path``.

        Returns:
            The number of records written.
        """
        key_list = list(keys) if keys is not None else None
        found = self.records(fingerprint, benchmark=benchmark, keys=key_list)
        if key_list is not None:
            by_key = {r.key: r for r in found}
            ordered = []
            seen: set[GroupKey] = set()
            for key in key_list:
                record = by_key.get(key)
                if record is not None and key not in seen:
                    ordered.append(record)
                    seen.add(key)
            found = ordered
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(b"".join(encode(r) + b"\n" for r in found))
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return len(found)
