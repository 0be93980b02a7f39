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


def fake_checkpoint(path: Path, weights: bytes, *, causal_lm: bool = False) -> Path:
    """A checkpoint folder with a config, one weight file holding ``weights`` and a tokenizer:
    a one-label reward classifier, or with ``causal_lm`` a causal LM (a DPO policy or a judge)."""
    path.mkdir(parents=True)
    config = '{"architectures": ["LlamaForCausalLM"]}' if causal_lm else (
        '{"architectures": ["LlamaForSequenceClassification"], "num_labels": 1}')
    (path / "config.json").write_text(config)
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return path
