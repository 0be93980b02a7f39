"""``rmserve.client`` re-exports its public API: one name, one object, from the module that defines it."""

from __future__ import annotations

import rmserve.client as client_stage
from rmserve.client import client, config, errors, records, score_file, score_log, score_store, trl_reward


def test_public_names_are_the_defining_modules_objects():
    expected = {
        "CONNECT_GRACE_S": client.CONNECT_GRACE_S,
        "PRIORITY_HEADER": client.PRIORITY_HEADER,
        "RewardClient": client.RewardClient,
        "PRIORITIES": config.PRIORITIES,
        "DEFAULT_MAX_RETRY_AFTER_S": config.DEFAULT_MAX_RETRY_AFTER_S,
        "Concurrency": config.Concurrency,
        "Retry": config.Retry,
        "Timeouts": config.Timeouts,
        "Waiting": config.Waiting,
        "connection_reason": errors.connection_reason,
        "error_from_reply": errors.error_from_reply,
        "parse_retry_after": errors.parse_retry_after,
        "check_reply": records.check_reply,
        "record_from_result": records.record_from_result,
        "refused_record": records.refused_record,
        "request_group": records.request_group,
        "SCORES_FILENAME": score_file.SCORES_FILENAME,
        "ScoreFile": score_file.ScoreFile,
        "ScoreFileWriter": score_file.ScoreFileWriter,
        "read_scores": score_file.read_scores,
        "Resumed": score_log.Resumed,
        "ScoreLog": score_log.ScoreLog,
        "STORE_ENV": score_store.STORE_ENV,
        "ScoreConflict": score_store.ScoreConflict,
        "ScoreStore": score_store.ScoreStore,
        "StoreVersionError": score_store.StoreVersionError,
        "checkpoint_signature": score_store.checkpoint_signature,
        "configured_store_path": score_store.configured_store_path,
        "default_store_path": score_store.default_store_path,
        "RMServeReward": trl_reward.RMServeReward,
        "AsyncRMServeReward": trl_reward.AsyncRMServeReward,
    }
    assert sorted(client_stage.__all__) == sorted(expected)
    for name, obj in expected.items():
        assert getattr(client_stage, name) is obj, name
