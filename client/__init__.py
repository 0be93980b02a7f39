"""The client stage: talk to a scoring server, and keep what it answered.

- :class:`RewardClient`: the async HTTP client of one server, its session and its batching
  (:mod:`rmserve.client.client`).
- Its settings, :class:`Timeouts`, :class:`Concurrency`, :class:`Retry` (with
  :data:`DEFAULT_MAX_RETRY_AFTER_S`, the cap of a ``Retry-After`` wait) and the
  :data:`PRIORITIES` of its priority hint, and :class:`Waiting`, what a wait for the server
  reports (:mod:`rmserve.client.config`).
- The groups sent and the records built: :func:`request_group`, :func:`check_reply`,
  :func:`record_from_result`, :func:`refused_record` (:mod:`rmserve.client.records`).
- Failures mapped back to the :mod:`rmserve.errors` classes: :func:`error_from_reply`,
  :func:`parse_retry_after`, :func:`connection_reason` (:mod:`rmserve.client.errors`).
- The score file, ``OUT/scores.jsonl``: one :class:`~rmserve.schema.ScoreRecord` per JSONL
  line, one model per file. :func:`read_scores` decodes it into a :class:`ScoreFile`;
  :class:`ScoreFileWriter` appends to it (:mod:`rmserve.client.score_file`).
- The score store: :class:`ScoreStore`, one SQLite file holding the records of every model and
  run, keyed by fingerprint (:mod:`rmserve.client.score_store`).
- :class:`RMServeReward` / :class:`AsyncRMServeReward`: a reward function for TRL's
  ``GRPOTrainer`` that scores with a server (:mod:`rmserve.client.trl_reward`).
- :class:`ScoreLog`: resume, owned in one place. The score file plus an optional score store,
  kept in step (:mod:`rmserve.client.score_log`).

This stage imports only the ground (:mod:`rmserve.schema`, :mod:`rmserve.errors`,
:mod:`rmserve.fingerprint`), never the server or metrics stages, and never torch or vllm.
"""

from rmserve.client.client import CONNECT_GRACE_S, PRIORITY_HEADER, RewardClient
from rmserve.client.config import DEFAULT_MAX_RETRY_AFTER_S, PRIORITIES, Concurrency, Retry, Timeouts, Waiting
from rmserve.client.errors import connection_reason, error_from_reply, parse_retry_after
from rmserve.client.records import check_reply, record_from_result, refused_record, request_group
from rmserve.client.score_file import SCORES_FILENAME, ScoreFile, ScoreFileWriter, read_scores
from rmserve.client.score_log import Resumed, ScoreLog
from rmserve.client.trl_reward import AsyncRMServeReward, RMServeReward
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
    "AsyncRMServeReward",
    "CONNECT_GRACE_S",
    "DEFAULT_MAX_RETRY_AFTER_S",
    "PRIORITIES",
    "PRIORITY_HEADER",
    "SCORES_FILENAME",
    "STORE_ENV",
    "Concurrency",
    "Resumed",
    "RMServeReward",
    "Retry",
    "RewardClient",
    "ScoreConflict",
    "ScoreFile",
    "ScoreFileWriter",
    "ScoreLog",
    "ScoreStore",
    "StoreVersionError",
    "Timeouts",
    "Waiting",
    "check_reply",
    "checkpoint_signature",
    "configured_store_path",
    "connection_reason",
    "default_store_path",
    "error_from_reply",
    "parse_retry_after",
    "read_scores",
    "record_from_result",
    "refused_record",
    "request_group",
]
