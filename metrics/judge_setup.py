"""A generative judge's set-up as its score records state it: sampling and engine, one per score set.

A judge's figures depend on more than its model and protocol: on how it decoded (temperature,
top_p, ``max_tokens``: :class:`~rmserve.schema.JudgeSampling`) and on what decoded (the engine,
its version, whether its batching is batch-invariant: :class:`~rmserve.schema.JudgeEngineInfo`).
Score records of kind ``judge`` carry both (``judge_sampling``, ``judge_engine``). This module
gathers them per score set (:class:`SetupCollector` → :class:`JudgeSetup`) and compares two
score sets (:func:`compare_setups`).

The rule (what a careful reader of the figures needs):

* Records that state their set-up must all state the same one: a score set whose records
  differ in any field of :data:`~rmserve.schema.JUDGE_SETUP_FIELDS` is refused
  (:class:`~rmserve.errors.DataError` naming the field, both values and both records). A
  comparison of two judges whose set-ups differ is allowed (comparing judges is its purpose)
  and says which fields differ. The explanation (``batch_invariant_note``) is not compared.
* Records written before rmserve recorded the set-up state none: their set-up is *unknown*.
  Unknown beside known is allowed, with a note saying how many records are unknown (a run
  resumed across the upgrade holds both, and its groups were scored under one fingerprint,
  which pins the model and every setting rmserve had then); the figures never claim a set-up
  for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rmserve.errors import DataError
from rmserve.schema import JUDGE_SETUP_FIELDS, JudgeEngineInfo, JudgeSampling, ScoreRecord


@dataclass(frozen=True)
class JudgeSetup:
    """The set-up of a judge's score set.

    Attributes:
        sampling: the sampling every record that states one states; None when none does.
        engine: likewise the engine (name, version, batch invariance).
        n_records: the judge's score records read.
        n_unrecorded: of them, records that state no sampling or no engine (unknown set-up).
    """

    sampling: JudgeSampling | None
    engine: JudgeEngineInfo | None
    n_records: int
    n_unrecorded: int

    @property
    def known(self) -> bool:
        """True when some record states its set-up."""
        return self.sampling is not None or self.engine is not None

    def value(self, record_field: str, name: str) -> Any:
        """The value of ``record_field.name`` (e.g. ``judge_sampling.temperature``); None when unknown."""
        part = self.sampling if record_field == "judge_sampling" else self.engine
        return None if part is None else getattr(part, name)

    def note(self) -> str | None:
        """The sentence the figures carry when some records state no set-up, else None."""
        if not self.n_unrecorded:
            return None
        if self.n_unrecorded == self.n_records:
            return (
                "The score records do not state the judge's sampling or engine (written before rmserve recorded "
                "them): that part of the judge's set-up is unknown."
            )
        return (
            f"{self.n_unrecorded} of {self.n_records} score records do not state the judge's sampling or engine "
            "(written before rmserve recorded them): their set-up is unknown; the set-up shown is the other "
            "records' only."
        )


@dataclass
class SetupCollector:
    """Gathers the set-up of a score set's judge records, record by record (:meth:`add`)."""

    sampling: JudgeSampling | None = None
    engine: JudgeEngineInfo | None = None
    first: dict[str, str] = field(default_factory=dict)
    """Per record field, where the record that first stated it was read (for messages)."""
    n_records: int = 0
    n_unrecorded: int = 0

    def add(self, record: ScoreRecord, where: Any) -> None:
        """Take one judge score record read at ``where`` (an object with ``describe()`` and
        ``error(message, field, value, limit)``, as the score-file readers' locations).

        Raises:
            DataError: the record states a set-up that differs from an earlier record's in a
                field of :data:`~rmserve.schema.JUDGE_SETUP_FIELDS` (the message names the field,
                both values and where the earlier record was read).
        """
        self.n_records += 1
        if record.judge_sampling is None or record.judge_engine is None:
            self.n_unrecorded += 1
        for record_field, name in JUDGE_SETUP_FIELDS:
            part = getattr(record, record_field)
            if part is None:
                continue
            known = self.sampling if record_field == "judge_sampling" else self.engine
            if known is None:
                setattr(self, record_field.removeprefix("judge_"), part)
                self.first[record_field] = where.describe()
                continue
            value, first = getattr(part, name), getattr(known, name)
            if value != first:
                raise where.error(
                    f"is {value!r} here but {first!r} in {self.first[record_field]}: a judge's figures depend on how "
                    "it decoded and on what decoded, so score records of different judge set-ups are not mixed; give "
                    "the score files of one set-up (or score the groups again)",
                    f"{record_field}.{name}",
                    value=value,
                    limit=first,
                )

    def setup(self) -> JudgeSetup:
        """The :class:`JudgeSetup` of the records taken."""
        return JudgeSetup(self.sampling, self.engine, self.n_records, self.n_unrecorded)


def compare_setups(a: JudgeSetup | None, b: JudgeSetup | None, *, name_a: str, name_b: str) -> list[str]:
    """The notes a paired comparison of two judges' score sets carries about their set-ups.

    Comparing two judges is what ``metrics compare`` is for (two judge models, two engines, two
    temperatures), so set-ups that differ are not refused: the comparison says which fields
    differ, since the difference B − A then measures them as well as the models.

    Args:
        a, b: each side's :class:`JudgeSetup` (None: the side is not a judge's; no note).
        name_a, name_b: how the sides are named in notes (their files).

    Returns:
        One note naming every field of :data:`~rmserve.schema.JUDGE_SETUP_FIELDS` whose values
        both sides state and differ (with both values), and one per side whose records (some or
        all) state no set-up.
    """
    if a is None or b is None:
        return []
    notes = []
    differ = [
        f"{record_field}.{name} {va!r} in A, {vb!r} in B"
        for record_field, name in JUDGE_SETUP_FIELDS
        for va, vb in [(a.value(record_field, name), b.value(record_field, name))]
        if va is not None and vb is not None and va != vb
    ]
    if differ:
        notes.append(
            f"A ({name_a}) and B ({name_b}) were judged under different set-ups ({'; '.join(differ)}): "
            "the differences B − A measure these settings as well as the judges."
        )
    for side, setup in (("A", a), ("B", b)):
        if setup.n_unrecorded:
            notes.append(
                f"{setup.n_unrecorded} of {setup.n_records} score records of {side} do not state the judge's sampling "
                "or engine (written before rmserve recorded them): the comparison cannot show that both sides were "
                "judged under one set-up."
            )
    return notes


__all__ = ["JudgeSetup", "SetupCollector", "compare_setups"]
