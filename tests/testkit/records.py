"""Score records and checkpoint folders for the score file, score store and resume tests."""

from __future__ import annotations

from pathlib import Path

from rmserve.schema import ScoreRecord


def score_record(
    i: int,
    *,
    fingerprint: str = "fp-a",
    model: str = "rm-a",
    domain: str = "chat",
    rewards: tuple[float | None, ...] | None = None,
    **extra: object,
) -> ScoreRecord:
    """An RM-Bench record of group ``i`` with one chosen and one rejected response.

    Defaults written out so tests can state them: rewards ``(i + 0.5, -i - 0.25)``,
    ``num_tokens`` ``(10 + i, 20 + i)``, ``num_cached_tokens`` ``(i, 0)``.
    """
    return ScoreRecord(
        benchmark="rm-bench",
        domain=domain,
        id=str(i),
        num_chosen=1,
        rewards=rewards if rewards is not None else (i + 0.5, -i - 0.25),
        num_tokens=(10 + i, 20 + i),
        num_cached_tokens=(i, 0),
        model=model,
        fingerprint=fingerprint,
        **extra,
    )


def fake_checkpoint(path: Path, weights: bytes) -> Path:
    """A checkpoint folder with a config, one weight file holding ``weights`` and a tokenizer."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}')
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path
