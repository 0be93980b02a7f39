"""Resume, owned by one object: the score file of an output folder plus an optional score store.

A run keeps what it has scored in up to two places: the **score file** ``OUT/scores.jsonl``
(:mod:`rmserve.client.score_file`: one model, one output folder, append-only) and the
**score store** (:mod:`rmserve.client.score_store`: SQLite, every model of every run, keyed by
fingerprint). :class:`ScoreLog` is the only code that keeps the two in step and decides which
groups of the data are done; a pipeline opens it, asks it what is missing, appends what the
server answers and finishes it.

Which place holds the truth, and when:

1. **Opening** (``with ScoreLog(...)``) locks the score file, reads it and cuts off a torn last
   line (an interrupted write; reported in :attr:`ScoreLog.notes`, its group is scored again).
2. **Resuming** (:meth:`ScoreLog.resume`, once the model is known): the score file must hold
   the same model (fingerprint) or nothing; another model's records are refused, or discarded
   with ``overwrite``. With a store, every record of the file is put into the store (an earlier
   run may have been killed before its store commit, or have had no store); a group both hold
   must have equal rewards. Then the data groups the store holds under the fingerprint and the
   file lacks are appended to the file, in data order. From here on the file's groups are the
   groups that are done.
3. **Scoring**: :meth:`ScoreLog.append` writes the record's line to the file, then puts it into
   the store.
4. **Finishing** (:meth:`ScoreLog.finish`): with a store, the file is rewritten from the store
   with exactly the data's groups, in data order (groups of other data leave the file, not the
   store). Without a store the file stays as appended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmserve.client.score_file import OpenedInWith, ScoreFileWriter
from rmserve.client.score_store import ScoreStore
from rmserve.errors import DataError, FingerprintMismatch
from rmserve.schema import Group, GroupKey, ModelInfo, ResponseError, ScoreKind, ScoreRecord, Truncation


LIMIT_REFUSALS: frozenset[str] = frozenset({"request_over_limit"})
"""``ResponseError`` types of groups the server refused for one of its limits (a group whose
tokens alone exceed the user's budget): the limit may have been raised since, so a rerun sends
such a group again whatever its options."""


SEQUENCE_TOO_LONG = "sequence_too_long"
"""The :class:`~rmserve.schema.ResponseError` type of a response over the length limit."""

_LENGTH_LIMIT = re.compile(r"max_model_len=([\d,]+)")


def length_limit_raised(record: ScoreRecord, max_model_len: int) -> bool:
    """Whether ``record`` has a response that was not scored for being over a length limit
    below ``max_model_len`` (tokens): a ``sequence_too_long`` error whose message names the
    limit it was over (``… over max_model_len=4,096``, as the server writes it). Such a group
    may be scorable now (the server was restarted with a larger ``--max-model-len``, or serves
    a checkpoint with a longer context). An error that names no limit gives False."""
    for error in record.errors or ():
        if error is None or error.type != SEQUENCE_TOO_LONG:
            continue
        limit = length_limit_of(error)
        if limit is not None and limit < max_model_len:
            return True
    return False


def length_limit_of(error: ResponseError) -> int | None:
    """The ``max_model_len`` an error's message says the response was over (tokens;
    ``… over max_model_len=4,096``), None when it names none."""
    found = _LENGTH_LIMIT.search(error.message)
    return None if found is None else int(found.group(1).replace(",", ""))


@dataclass(frozen=True)
class StaleGroups:
    """Groups recorded as not scored that a run scores again, by why (:func:`stale_groups`).

    Attributes:
        refused: refused for a limit of the user (:data:`LIMIT_REFUSALS`; it may have been
            raised since).
        other_options: not scored under another truncation than the run's.
        longer: a response over a shorter ``max_model_len`` than the server's now
            (:func:`length_limit_raised`).
    """

    refused: frozenset[GroupKey] = frozenset()
    other_options: frozenset[GroupKey] = frozenset()
    longer: frozenset[GroupKey] = frozenset()

    @property
    def keys(self) -> frozenset[GroupKey]:
        """Every stale group."""
        return self.refused | self.other_options | self.longer

    def notes(self, truncation: Truncation | None, max_model_len: int | None) -> list[str]:
        """One ``scoring again …`` sentence per reason with groups (for the run's notes)."""
        notes = []
        if self.other_options:
            notes.append(f"scoring again {groups_text(len(self.other_options))} that could not be scored under other "
                         f"options (truncation now: {_truncation_text(truncation)})")
        if self.refused:
            notes.append(f"scoring again {groups_text(len(self.refused))} the server refused as over a limit of the "
                         "user (the limit may have been raised since)")
        if self.longer:
            notes.append(f"scoring again {groups_text(len(self.longer))} with a response that was over a shorter "
                         f"max_model_len than the server's {max_model_len or 0:,} tokens now")
        return notes


def stale_groups(
    records: Iterable[ScoreRecord], truncation: Truncation | None, max_model_len: int | None = None
) -> StaleGroups:
    """Of ``records``, the groups not scored that a run with ``truncation`` on a server of
    ``max_model_len`` tokens (None: not known) scores again, each under its first reason in
    the order of :class:`StaleGroups`. The rule every resume uses: a score file, a score store,
    a sweep. A group not scored under the same options stays done (the reason has not changed).
    """
    unscored = [r for r in records if not r.scored]
    refused = frozenset(r.key for r in unscored if r.first_error.type in LIMIT_REFUSALS)
    other = frozenset(r.key for r in unscored if r.truncation != truncation) - refused
    longer = frozenset(
        r.key for r in unscored if max_model_len is not None and length_limit_raised(r, max_model_len)
    ) - refused - other
    return StaleGroups(refused, other, longer)


def groups_text(n: int) -> str:
    """``1 group``, ``2 groups``."""
    return f"{n} group{'' if n == 1 else 's'}"


def _truncation_text(truncation: Truncation | None) -> str:
    """``left to 512 tokens``, or ``none``."""
    return "none" if truncation is None else f"{truncation.side} to {truncation.max_tokens} tokens"


@dataclass(frozen=True)
class Resumed:
    """Where a run stands after :meth:`ScoreLog.resume`.

    Attributes:
        model: the model the log now holds records of.
        n_resumed: data groups the score file already held (after the model check, before
            anything was copied from the store).
        n_from_store: data groups copied from the score store into the score file.
        n_extra: groups in the score file that are not in the data (left out of
            :meth:`ScoreLog.records`; kept in the file until :meth:`ScoreLog.finish` rewrites
            it from a store).
    """

    model: ModelInfo
    n_resumed: int
    n_from_store: int
    n_extra: int


class ScoreLog(OpenedInWith):
    """The score file of one output folder, kept in step with an optional score store.

    ``with ScoreLog(path, store=store) as log:`` locks and reads the file; then
    :meth:`resume` (model and data known) → :meth:`missing` → :meth:`append` per answered
    group → :meth:`records` → :meth:`finish`. Leaving the block releases the file (the store
    stays open: it belongs to the caller). An error before :meth:`finish` leaves the file as
    appended so far, which is what the next run resumes from.

    Args:
        path: the score file (created with its folder if missing).
        store: an open :class:`~rmserve.client.score_store.ScoreStore`, or None for no store.
            The log reads and writes it but does not close it.
        fsync: ``os.fsync`` the score file after every appended record. Default False.
    """

    def __init__(self, path: str | Path, *, store: ScoreStore | None = None, fsync: bool = False) -> None:
        self.path = Path(path)
        self.store = store
        self._file = ScoreFileWriter(self.path, fsync=fsync)
        self._notes: list[str] = []
        self._order: dict[GroupKey, int] | None = None
        self._groups: tuple[Group, ...] = ()
        self._model: ModelInfo | None = None

    def open(self) -> None:
        """Lock the score file, read it and cut off a torn last line (noted in :attr:`notes`).

        Raises:
            rmserve.errors.DataError: another run holds the file, or a line of it (other
                than a torn last one) is invalid (names file and line).
        """
        self._file.open()
        existing = self._file.existing
        if existing is not None and existing.dropped_note:
            self._notes.append(existing.dropped_note)

    def close(self) -> None:
        """Release the score file; idempotent. The store is left open."""
        self._file.close()

    @property
    def notes(self) -> tuple[str, ...]:
        """Sentences about what opening and resuming found or did, in order."""
        return tuple(self._notes)

    def resume(
        self,
        model: ModelInfo,
        groups: Sequence[Group],
        *,
        overwrite: bool = False,
        truncation: Truncation | None = None,
    ) -> Resumed:
        """Check the score file against ``model`` and bring file and store in step for ``groups``.

        Args:
            model: the model being evaluated (``model.fingerprint`` keys the store).
            groups: the benchmark data, in data order; :meth:`missing`, :meth:`records` and
                :meth:`finish` refer to it.
            overwrite: discard the file's records of another model instead of refusing.
            truncation: the truncation this run asks for. A group that could not be scored
                (a response with an error) under other options is removed from the file and
                scored again; under the same options it stays done (the reason has not changed),
                unless the server refused it for one of its limits (:data:`LIMIT_REFUSALS`),
                which may have changed: such a group is always scored again; and unless a
                response was over a shorter ``max_model_len`` than ``model``'s
                (:func:`length_limit_raised`): such a group is scored again too.

        Returns:
            The counts of :class:`Resumed`.

        Raises:
            rmserve.errors.FingerprintMismatch: the file holds another model's records and
                ``overwrite`` is False (names both models).
            rmserve.client.score_store.ScoreConflict: the file and the store hold different
                rewards for one group (names the group).
            RuntimeError: the log is not open.
        """
        self._require_open()
        self._model = model
        self._groups = tuple(groups)
        self._order = {g.key: i for i, g in enumerate(self._groups)}
        n_before = len(self._file.records)
        if self._file.check_model(
            model=model.name, fingerprint=model.fingerprint, overwrite=overwrite, kind=ScoreKind.of(model)
        ):
            self._notes.append(f"--overwrite: discarded {n_before} stored groups of another model")
        resumed = self._file.scored_keys() & self._order.keys()
        n_from_store = self._sync_with_store(model.fingerprint) if self.store is not None else 0
        found = stale_groups(self._file.records, truncation, model.max_model_len)
        stale = found.keys
        if stale:
            self._file.discard(stale)
            self._notes.extend(found.notes(truncation, model.max_model_len))
            n_from_store -= len(stale & self._order.keys() - resumed)
        if n_from_store:
            assert self.store is not None
            self._notes.append(f"answered from the store: {groups_text(n_from_store)} ({self.store.path})")
        n_resumed = len(resumed - stale)
        n_extra = sum(1 for key in self._file.scored_keys() if key not in self._order)
        return Resumed(model=model, n_resumed=n_resumed, n_from_store=n_from_store, n_extra=n_extra)

    def _sync_with_store(self, fingerprint: str) -> int:
        """File records into the store, then the store's data groups the file lacks into the file.

        Returns how many groups were appended to the file (:meth:`resume` says how many of
        them stay: those not scored again).
        """
        store = self.store
        assert store is not None
        in_store = store.stored_keys(fingerprint)
        added = 0
        for record in self._file.records:
            store.put(record)  # a group stored already is compared (equal rewards: ignored)
            added += record.key not in in_store
        if added:
            store.flush()
            self._notes.append(f"added {added} groups of {self.path} to the score store {store.path}")
        in_file = self._file.scored_keys()
        wanted = [g.key for g in self._groups if g.key not in in_file and g.key in in_store]
        if not wanted:
            return 0
        by_key = {r.key: r for r in store.records(fingerprint, keys=wanted)}
        for key in wanted:
            self._file.append(by_key[key])
        return len(wanted)

    def done_keys(self) -> frozenset[GroupKey]:
        """Keys of every group in the score file (data groups and others)."""
        return self._file.scored_keys()

    def missing(self) -> list[Group]:
        """The data groups not yet in the score file, in data order (those still to score)."""
        self._require_resumed()
        done = self._file.scored_keys()
        return [g for g in self._groups if g.key not in done]

    def append(self, record: ScoreRecord, *, server_version: str = "") -> None:
        """Write ``record`` to the score file, then put it into the store (when there is one).

        Args:
            record: one answered group.
            server_version: the scoring server's version, kept in the store's row ('' when
                unknown).

        Raises:
            rmserve.errors.DataError: the group is already in the score file.
            rmserve.errors.FingerprintMismatch: the record's fingerprint is not the resumed
                model's (names both).
            rmserve.client.score_store.ScoreConflict: the store holds other rewards for it.
            RuntimeError: :meth:`resume` was not called, or the log is closed.
        """
        self._require_resumed()
        assert self._model is not None
        if record.fingerprint != self._model.fingerprint:
            raise FingerprintMismatch(
                f"{self.path}: record of {str(record.key)!r} has fingerprint {record.fingerprint!r}, "
                f"the run's model {self._model.name!r} has {self._model.fingerprint!r}",
                field="fingerprint",
                value=record.fingerprint,
            )
        self._file.append(record)
        if self.store is not None:
            self.store.put(record, server_version=server_version)

    def records(self) -> list[ScoreRecord]:
        """The score file's records of the data groups, in data order.

        Data order makes a resumed run report exactly what an uninterrupted one would.
        """
        order = self._require_resumed()
        return sorted((r for r in self._file.records if r.key in order), key=lambda r: order[r.key])

    def finish(self) -> None:
        """Release the score file; with a store, rewrite it from the store.

        The rewritten file holds exactly the data's groups, in data order, atomically
        replaced. Without a store the file stays as appended.

        Raises:
            rmserve.errors.DataError: a data group is not in the store (names the first one);
                the file is then left as appended.
            RuntimeError: :meth:`resume` was not called.
        """
        self._require_resumed()
        assert self._model is not None
        self._file.close()
        if self.store is None:
            return
        keys = [g.key for g in self._groups]
        written = self.store.export_jsonl(self.path, self._model.fingerprint, keys=keys)
        if written != len(keys):
            stored = self.store.stored_keys(self._model.fingerprint)
            absent = next(k for k in keys if k not in stored)
            raise DataError(
                f"the score store holds {written} of the {len(keys)} data groups after the run; "
                f"group {str(absent)!r} is missing",
                path=str(self.store.path),
                record_id=str(absent),
            )

    def _require_open(self) -> None:
        if self._file.closed:
            raise RuntimeError("ScoreLog is not open: use 'with ScoreLog(path) as log'")

    def _require_resumed(self) -> dict[GroupKey, int]:
        if self._order is None:
            raise RuntimeError("ScoreLog.resume(model, groups) must come first")
        return self._order
