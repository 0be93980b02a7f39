"""The score file: one :class:`~rmserve.schema.ScoreRecord` per JSONL line, append-only.

Each scored group is written with a single unbuffered ``write`` of its line (plus an
optional ``fsync``), so a run that is killed loses at most the line being written. Reading
tolerates that line: a last line with no newline that is not valid JSON is ignored and
reported (and cut off before the next append); a bad line anywhere else is a
:class:`~rmserve.errors.DataError` naming file and line. Reading also skips a leading UTF-8
byte-order mark and accepts the ``NaN``/``Infinity`` literals of Python's ``json``; writing
stays strict JSON.

A score file holds one model: every record carries the server's ``model`` and
``fingerprint``, and all must agree. Records also say what kind of score they hold (``kind``,
and for DPO ``mode``, ``ref_model``, ``compat``) and keep the engine's ``extras``; the
fingerprint covers the kind, so a file refuses to resume under another DPO mode as under
another model (:meth:`ScoreFileWriter.check_model` names both kinds). Keys (benchmark/domain/id)
are unique: resuming skips :meth:`ScoreFileWriter.scored_keys` and :meth:`ScoreFileWriter.append`
refuses a key already stored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import msgspec
import orjson

from rmserve.datasets import TornLine, loads_json, strip_bom
from rmserve.errors import DataError, FingerprintMismatch, field_path
from rmserve.schema import GroupKey, ScoreKind, ScoreRecord, encode

try:  # POSIX advisory locks keep two runs from appending to one file.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

SCORES_FILENAME = "scores.jsonl"
"""Name of the score file inside an output folder."""


@dataclass(frozen=True)
class ScoreFile:
    """The decoded content of a score file.

    Attributes:
        path: the file.
        records: the records in file order.
        valid_bytes: length of the file prefix holding complete, valid lines.
        ends_with_newline: whether that prefix ends with a newline (False only for a valid
            last record written without one).
        dropped_line: the 1-based number of an ignored truncated last line, else None.
        dropped_bytes: its length in bytes (0 when none).
    """

    path: Path
    records: tuple[ScoreRecord, ...]
    valid_bytes: int
    ends_with_newline: bool
    dropped_line: int | None = None
    dropped_bytes: int = 0

    @property
    def model(self) -> str | None:
        """The model name of the records (None for an empty file)."""
        return self.records[0].model if self.records else None

    @property
    def fingerprint(self) -> str | None:
        """The model fingerprint of the records (None for an empty file)."""
        return self.records[0].fingerprint if self.records else None

    @property
    def dropped_note(self) -> str | None:
        """A sentence reporting the ignored truncated last line, if there was one."""
        if self.dropped_line is None:
            return None
        return TornLine(str(self.path), self.dropped_line, self.dropped_bytes).message(
            "its group will be scored again"
        )


_decoder = msgspec.json.Decoder(ScoreRecord)


def _decode_line(line: bytes) -> ScoreRecord:
    """One line → ScoreRecord: msgspec first, then (for ``NaN``/``Infinity``/``1e999``, which
    it refuses) Python's json followed by the same validation.

    Raises:
        orjson.JSONDecodeError: the line is not JSON at all.
        msgspec.ValidationError: JSON, but not a valid ScoreRecord.
    """
    try:
        return _decoder.decode(line)
    except msgspec.DecodeError:  # ValidationError included: a cut line can fail either way
        value = loads_json(line)
        return msgspec.convert(value, type=ScoreRecord)


def read_scores(path: str | Path) -> ScoreFile:
    """Read and check a score file.

    Blank lines are skipped and a leading UTF-8 byte-order mark is ignored. A missing file
    reads as empty. Rewards written as ``NaN``, ``Infinity``, ``-Infinity`` or an overflowing
    number (``1e999``), as Python's ``json`` writes them, are read as those floats. A last
    line with no newline after it that is not valid JSON (a write cut short) is left out
    and reported in ``dropped_line`` / ``dropped_bytes`` / :attr:`ScoreFile.dropped_note`.

    Raises:
        DataError: a line (other than such a torn last line) that is not JSON or not a valid
            ScoreRecord (then ``field`` is the offending field's path), a key stored twice, or
            a record whose model fingerprint differs from the first record's. The message
            names the file and line.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ScoreFile(path=path, records=(), valid_bytes=0, ends_with_newline=True)
    raw, offset = strip_bom(raw)
    lines = raw.split(b"\n")
    # split() leaves a last piece with no newline after it: empty when the file ends with one.
    records: list[ScoreRecord] = []
    first_line: dict[GroupKey, int] = {}
    valid_bytes = offset
    ends_with_newline = True
    for index, line in enumerate(lines):
        lineno = index + 1
        terminated = index < len(lines) - 1
        end = offset + len(line) + (1 if terminated else 0)
        if not line.strip():
            offset = end
            if terminated or not line:
                valid_bytes = end
            continue
        try:
            record = _decode_line(line)
        except orjson.JSONDecodeError as exc:
            if not terminated:
                return ScoreFile(
                    path=path,
                    records=tuple(records),
                    valid_bytes=valid_bytes,
                    ends_with_newline=ends_with_newline,
                    dropped_line=lineno,
                    dropped_bytes=len(line),
                )
            raise DataError(
                f"not a valid score record (invalid JSON: {exc.msg})", path=str(path), line=lineno
            ) from None
        except msgspec.ValidationError as exc:
            raise DataError(
                f"not a valid score record ({exc})", path=str(path), line=lineno, field=field_path(exc)
            ) from None
        key = record.key
        if key in first_line:
            raise DataError(
                f"group {str(key)!r} is stored twice (first at line {first_line[key]})",
                path=str(path), line=lineno, record_id=record.id,
            )
        if records and record.fingerprint != records[0].fingerprint:
            raise DataError(
                f"model fingerprint {record.fingerprint!r} differs from {records[0].fingerprint!r} of line "
                f"{first_line[records[0].key]}; a score file holds one model",
                path=str(path), line=lineno, record_id=record.id, field="fingerprint",
            )
        first_line[key] = lineno
        records.append(record)
        offset = end
        valid_bytes = end
        ends_with_newline = terminated
    return ScoreFile(path=path, records=tuple(records), valid_bytes=valid_bytes, ends_with_newline=ends_with_newline)


class OpenedInWith:
    """``with`` support for a class with ``open()`` and ``close()``: entering the block calls
    ``open()`` and gives the object itself, leaving it (normally or by an exception) calls ``close()``."""

    def __enter__(self) -> Self:
        self.open()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()  # type: ignore[attr-defined]


class ScoreFileWriter(OpenedInWith):
    """Append-only writer of a score file, for one run at a time.

    ``with ScoreFileWriter(path) as score_file:`` locks the file (a second writer gets a DataError),
    reads what is there (:attr:`existing`), cuts off a truncated last line, and then appends
    one record per :meth:`append`.

    Args:
        path: the score file (created with its folder if missing).
        fsync: ``os.fsync`` after every record. A killed process loses nothing already
            written either way; fsync also guards against a machine crash, at a cost per
            group. Default False.
    """

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd: int | None = None
        self._records: list[ScoreRecord] = []
        self._keys: set[GroupKey] = set()
        self.existing: ScoreFile | None = None

    def open(self) -> None:
        """Lock the file, load it, and repair an interrupted last write.

        Raises:
            DataError: another process holds the file, or the file is invalid (see
                :func:`read_scores`).
        """
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise DataError("another run is writing this score file", path=str(self.path)) from None
            existing = read_scores(self.path)
            if existing.dropped_line is not None:
                os.ftruncate(fd, existing.valid_bytes)
            if not existing.ends_with_newline:
                self._write(fd, b"\n")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.existing = existing
        self._records = list(existing.records)
        self._keys = {r.key for r in existing.records}

    def close(self) -> None:
        """Release the lock and the file; idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        """True before :meth:`open` and after :meth:`close`."""
        return self._fd is None

    @property
    def records(self) -> tuple[ScoreRecord, ...]:
        """Every record in the file: those found on open, then those appended."""
        return tuple(self._records)

    @property
    def fingerprint(self) -> str | None:
        """The fingerprint of the stored records (None while empty)."""
        return self._records[0].fingerprint if self._records else None

    @property
    def model(self) -> str | None:
        """The model name of the stored records (None while empty)."""
        return self._records[0].model if self._records else None

    def scored_keys(self) -> frozenset[GroupKey]:
        """Keys of the groups already stored (to skip when resuming)."""
        return frozenset(self._keys)

    @property
    def score_kind(self) -> ScoreKind | None:
        """What kind of score the stored records hold (None while empty)."""
        return self._records[0].score_kind if self._records else None

    def check_model(
        self, *, model: str, fingerprint: str, overwrite: bool = False, kind: ScoreKind | None = None
    ) -> bool:
        """Make sure the stored records belong to the model the server serves.

        Args:
            model, fingerprint: what the server reports (``GET /v1/models``).
            overwrite: on a mismatch, empty the file instead of refusing.
            kind: what kind of score the server gives (``ScoreKind.of`` its ModelInfo); None
                for a classifier. Named in the refusal when it or the file's is not a plain
                classifier's (e.g. another DPO mode).

        Returns:
            True when the file was emptied (overwrite of another model's scores).

        Raises:
            FingerprintMismatch: the file holds another model's scores (the fingerprint covers
                the DPO mode, reference and compat) and ``overwrite`` is False. The message
                names both models, both kinds when either is not a classifier's, and the way out.
        """
        if not self._records or self.fingerprint == fingerprint:
            return False
        if not overwrite:
            stored_kind, server_kind = self._records[0].score_kind, kind or ScoreKind()
            plain = ScoreKind()
            stored_text = server_text = ""
            if stored_kind != plain or server_kind != plain:
                stored_text, server_text = f", {stored_kind.describe()}", f", {server_kind.describe()}"
            raise FingerprintMismatch(
                f"{self.path} holds scores of a different model ({self.model!r}, fingerprint "
                f"{self.fingerprint!r}{stored_text}) than the server's ({model!r}, fingerprint {fingerprint!r}"
                f"{server_text}). What is stored here ({_groups(len(self._records))}) stays valid for fingerprint "
                f"{self.fingerprint!r}: to resume it, run the same command again once the server serves that "
                "checkpoint again (an admin loads it: rmserve models load); to score the server's model, use "
                "another output folder. --overwrite discards them",
                field="fingerprint",
                value=fingerprint,
            )
        self.reset()
        return True

    def reset(self) -> None:
        """Discard every stored record (truncate the file to empty)."""
        fd = self._require_open()
        os.ftruncate(fd, 0)
        self._records.clear()
        self._keys.clear()

    def discard(self, keys: Iterable[GroupKey]) -> int:
        """Remove the records of ``keys`` from the file (rewritten in place, order kept).

        Used to score groups again (a group that could not be scored, rerun under other
        options). Returns how many records were removed; unknown keys are ignored.
        """
        fd = self._require_open()
        drop = set(keys) & self._keys
        if not drop:
            return 0
        kept = [r for r in self._records if r.key not in drop]
        os.ftruncate(fd, 0)
        self._write(fd, b"".join(encode(r) + b"\n" for r in kept))
        if self.fsync:
            os.fsync(fd)
        self._records = kept
        self._keys -= drop
        return len(drop)

    def append(self, record: ScoreRecord) -> None:
        """Write ``record`` as one line, then fsync when configured.

        Raises:
            DataError: the record's group is already stored.
            FingerprintMismatch: the record's fingerprint differs from the stored records'.
        """
        fd = self._require_open()
        key = record.key
        if key in self._keys:
            raise DataError(f"group {str(key)!r} is already stored", path=str(self.path), record_id=record.id)
        if self._records and record.fingerprint != self.fingerprint:
            raise FingerprintMismatch(
                f"{self.path}: record of {str(key)!r} has fingerprint {record.fingerprint!r}, the file holds "
                f"{self.fingerprint!r}",
                field="fingerprint",
            )
        self._write(fd, encode(record) + b"\n")
        if self.fsync:
            os.fsync(fd)
        self._records.append(record)
        self._keys.add(key)

    def _require_open(self) -> int:
        if self._fd is None:
            raise RuntimeError("ScoreFileWriter is not open: use 'with ScoreFileWriter(path) as score_file'")
        return self._fd

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]


def _groups(n: int) -> str:
    return f"{n} group" if n == 1 else f"{n} groups"
