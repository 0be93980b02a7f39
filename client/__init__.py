"""The client stage: talk to a scoring server, and keep what it answered.

- :class:`RewardClient` (with :class:`Timeouts`, :class:`Concurrency`, :class:`Retry`): the
  async HTTP client of one server (:mod:`rmserve.client.client`).
- The score file, ``OUT/scores.jsonl``: one :class:`~rmserve.schema.ScoreRecord` per JSONL
  line, one model per file. :func:`read_scores` decodes it into a :class:`ScoreFile`;
  :class:`ScoreFileWriter` appends to it (:mod:`rmserve.client.score_file`).
- The score store: :class:`ScoreStore`, one SQLite file holding the records of every model and
  run, keyed by fingerprint (:mod:`rmserve.client.score_store`).
- :class:`ScoreLog`: resume, owned in one place. The score file plus an optional score store,
  kept in step (:mod:`rmserve.client.score_log`).

This stage imports only the ground (:mod:`rmserve.schema`, :mod:`rmserve.errors`,
:mod:`rmserve.fingerprint`), never the server or metrics stages, and never torch or vllm.
"""

from rmserve.client.client import Concurrency, Retry, RewardClient, Timeouts
from rmserve.client.score_file import SCORES_FILENAME, ScoreFile, ScoreFileWriter, read_scores
from rmserve.client.score_log import Resumed, ScoreLog
from rmserve.client.score_store import (
    STORE_ENV,
    ScoreConflict,
    ScoreStore,
    StoreVersionError,
    checkpoint_signature,
    configured_store_path,
    default_store_path,
)

__all__ = [
    "SCORES_FILENAME",
    "STORE_ENV",
    "Concurrency",
    "Resumed",
    "Retry",
    "RewardClient",
    "ScoreConflict",
    "ScoreFile",
    "ScoreFileWriter",
    "ScoreLog",
    "ScoreStore",
    "StoreVersionError",
    "Timeouts",
    "checkpoint_signature",
    "configured_store_path",
    "default_store_path",
    "read_scores",
]
