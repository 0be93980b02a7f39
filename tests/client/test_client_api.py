"""``rmserve.client`` re-exports its public API: one name, one object, from the module that defines it."""

from __future__ import annotations

import rmserve.client as client_stage
from rmserve.client import client, score_file, score_log, score_store


def test_public_names_are_the_defining_modules_objects():
    expected = {
        "Concurrency": client.Concurrency,
        "Retry": client.Retry,
        "RewardClient": client.RewardClient,
        "Timeouts": client.Timeouts,
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
    }
    assert sorted(client_stage.__all__) == sorted(expected)
    for name, obj in expected.items():
        assert getattr(client_stage, name) is obj, name
