"""What can be known about a checkpoint folder from its files, before any engine touches it.

A checkpoint swap (``POST /v1/models/load``) used to find out that a folder could not be
served only when the engine failed to load it: the engine stopped, the restart failed, the
previous checkpoint was restarted, and minutes later the reply was a 500. Everything that
the files themselves decide is checked here instead, in milliseconds, on a few KiB of JSON:

- ``config.json`` exists and is a JSON object;
- for a sequence-classifier reward model: an ``*ForSequenceClassification`` architecture and
  exactly one label (the reward logit), counted as transformers counts it — the length of
  ``id2label`` when present, else ``num_labels``, else transformers' default of 2; for a
  DPO policy (kind ``dpo``): a causal-LM architecture (``*ForCausalLM`` / ``*LMHeadModel``);
- tokenizer files: at least one of :data:`~rmserve.fingerprint.TOKENIZER_FILES`, and every
  JSON one among them parses;
- weights: a ``*.safetensors`` or ``*.bin`` file, or an index (``*.index.json``) whose every
  shard is present.

A refusal is :class:`~rmserve.errors.InvalidCheckpoint` (422) naming the folder, the file and
the rule; the engine and the served model are untouched. No torch, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rmserve.fingerprint import TOKENIZER_FILES

from rmserve.errors import InvalidCheckpoint

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin")
"""File suffixes that hold weights (safetensors, PyTorch pickles)."""

CAUSAL_LM_SUFFIXES: tuple[str, ...] = ("ForCausalLM", "LMHeadModel")
"""Architecture name endings of a causal LM with an LM head (``LlamaForCausalLM``, ``GPT2LMHeadModel``)."""

TRANSFORMERS_DEFAULT_NUM_LABELS = 2
"""What transformers' ``PretrainedConfig`` assumes when a config names neither ``id2label`` nor ``num_labels``."""


def _refuse(folder: Path, message: str, file: str | None = None) -> InvalidCheckpoint:
    where = f"{folder.name}/{file}" if file else folder.name
    return InvalidCheckpoint(f"checkpoint {where!r}: {message}", field="path")


def _read_json(folder: Path, name: str) -> Any:
    try:
        return json.loads((folder / name).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise _refuse(folder, "is missing", name) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _refuse(folder, f"is not readable JSON ({type(exc).__name__}: {exc})", name) from None


def is_causal_lm_architecture(name: object) -> bool:
    """True for an architecture name ending in one of :data:`CAUSAL_LM_SUFFIXES`."""
    return isinstance(name, str) and name.endswith(CAUSAL_LM_SUFFIXES)


def num_labels(config: dict[str, Any]) -> int:
    """The number of labels transformers gives a model with this ``config.json`` content.

    ``len(id2label)`` when ``id2label`` is present (transformers derives ``num_labels`` from it),
    else ``num_labels``, else :data:`TRANSFORMERS_DEFAULT_NUM_LABELS`.
    """
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    value = config.get("num_labels")
    return int(value) if isinstance(value, int) else TRANSFORMERS_DEFAULT_NUM_LABELS


def check_config(folder: Path, kind: str = "classifier") -> dict[str, Any]:
    """Read ``folder/config.json`` and check it describes a model of ``kind``; returns the config.

    Args:
        folder: a local checkpoint folder.
        kind: ``classifier`` (a sequence classifier with one reward logit) or ``dpo`` (a
            causal LM: an architecture ending in ``ForCausalLM`` or ``LMHeadModel``). Other
            kinds have no architecture rule here: only readability is checked.

    Raises:
        InvalidCheckpoint (422, field ``path``): missing or unreadable config, not a JSON
            object, or (classifier) no ``*ForSequenceClassification`` architecture or a label
            count other than 1, or (dpo) no causal-LM architecture.
    """
    config = _read_json(folder, "config.json")
    if not isinstance(config, dict):
        raise _refuse(folder, f"holds a JSON {type(config).__name__}, not an object", "config.json")
    if kind == "dpo":
        architectures = config.get("architectures") or []
        if not any(is_causal_lm_architecture(a) for a in architectures):
            classifier = any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures)
            raise _refuse(
                folder,
                f"architectures is {architectures!r}; a DPO policy must be a causal LM with an LM head "
                "(*ForCausalLM or *LMHeadModel)"
                + ("; this is a reward classifier, which a --kind dpo server cannot load" if classifier else ""),
                "config.json",
            )
    if kind == "classifier":
        architectures = config.get("architectures") or []
        if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
            raise _refuse(
                folder,
                f"architectures is {architectures!r}; a reward model must be a *ForSequenceClassification",
                "config.json",
            )
        labels = num_labels(config)
        if labels != 1:
            raise _refuse(
                folder,
                f"has {labels} labels (num_labels/id2label); a reward model must have exactly 1, the reward logit",
                "config.json",
            )
    return config


def check_tokenizer_files(folder: Path) -> tuple[str, ...]:
    """Check the tokenizer files of ``folder``; returns the names present.

    Raises:
        InvalidCheckpoint (422, field ``path``): none of
            :data:`~rmserve.fingerprint.TOKENIZER_FILES` is present, or a JSON one does not parse.
    """
    present = tuple(name for name in TOKENIZER_FILES if (folder / name).is_file())
    if not present:
        raise _refuse(folder, f"has no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    for name in present:
        if name.endswith(".json"):
            _read_json(folder, name)
    return present


def check_weight_files(folder: Path) -> tuple[str, ...]:
    """Check that ``folder`` holds weights; returns the weight file names.

    A sharded checkpoint (an ``*.index.json`` with a ``weight_map``) must have every shard it
    names; otherwise at least one ``*.safetensors`` / ``*.bin`` file must be there.

    Raises:
        InvalidCheckpoint (422, field ``path``): no weight file, an unreadable index, or a
            shard named by an index that is missing (the first one is named).
    """
    for index_name in sorted(p.name for p in folder.glob("*.index.json")):
        index = _read_json(folder, index_name)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise _refuse(folder, "has no weight_map", index_name)
        shards = sorted({str(shard) for shard in weight_map.values()})
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            raise _refuse(folder, f"names {len(missing)} missing shard(s) of {len(shards)}, first {missing[0]!r}", index_name)
        return tuple(shards)
    weights = tuple(sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES))
    if not weights:
        raise _refuse(folder, f"has no weight files ({' or '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    return weights


def check_checkpoint(folder: str | Path, kind: str = "classifier") -> None:
    """All file checks of a checkpoint folder before it is loaded: config, tokenizer, weights.

    Raises:
        InvalidCheckpoint (422, field ``path``): the first rule the folder breaks (see the
            module docstring); nothing else is touched.
    """
    folder = Path(folder)
    check_config(folder, kind)
    check_tokenizer_files(folder)
    check_weight_files(folder)
