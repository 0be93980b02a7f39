"""Engine backends by name, imported only when chosen.

``rmserve serve --engine NAME`` resolves ``NAME`` here; the map holds ``"module:attr"``
strings so that importing this module (or the CLI) never imports torch or vllm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rmserve.schema import DPO_KIND, JUDGE_KIND, LENGTH_KIND

if TYPE_CHECKING:
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.protocol import JudgeEngine, RewardEngine

ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engines.vllm_engine:VLLMEngine",
    "hf": "rmserve.server.engines.hf_engine:HFEngine",
}
"""Engine name → ``"module:attr"`` of a class taking an :class:`EngineConfig`."""

LOGPROB_ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engines.vllm_engine:VLLMLogprobEngine",
    "hf": "rmserve.server.engines.hf_engine:HFLogprobEngine",
}
"""Engine name → ``"module:attr"`` of a :class:`~rmserve.server.engines.protocol.LogprobEngine` class
taking ``(config, model)``; a DPO engine (:mod:`rmserve.server.engines.dpo_pair`) builds its policy and
reference from it."""

DPO_ENGINE = "rmserve.server.engines.dpo_pair:DPOEngine"
"""``"module:attr"`` of the engine of ``kind="dpo"`` (it wraps the :data:`LOGPROB_ENGINES` of
``config.engine``)."""

JUDGE_ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engines.vllm_engine:VLLMJudgeEngine",
    "hf": "rmserve.server.engines.hf_engine:HFJudgeEngine",
}
"""Engine name → ``"module:attr"`` of a local :class:`~rmserve.server.engines.protocol.JudgeEngine`
class taking an :class:`EngineConfig` (``kind="judge"`` without ``judge_url``)."""

OPENAI_JUDGE_ENGINE = "rmserve.server.engines.openai_judge:OpenAIJudgeEngine"
"""``"module:attr"`` of the judge engine of ``kind="judge"`` with ``judge_url`` set (an
OpenAI-compatible chat-completions endpoint; ``config.engine`` is then not used)."""


LENGTH_ENGINE = "rmserve.server.engines.length:LengthEngine"
"""``"module:attr"`` of the engine of ``kind="length"`` (a tokenizer, no weights; ``config.engine``
is not used)."""


def _import(target: str) -> type:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def engine_class(name: str) -> type:
    """Import and return the engine class registered as ``name``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the choices.
    """
    try:
        target = ENGINES[name]
    except KeyError:
        raise ValueError(f"engine: unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def logprob_engine_class(name: str) -> type:
    """Import and return the log-probability engine class registered as ``name``.

    Raises:
        ValueError: ``name`` is not in :data:`LOGPROB_ENGINES`; the message lists the choices.
    """
    try:
        target = LOGPROB_ENGINES[name]
    except KeyError:
        raise ValueError(
            f"engine: no log-prob engine {name!r}; choose one of {', '.join(sorted(LOGPROB_ENGINES))}"
        ) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def judge_engine_class(config: EngineConfig) -> type:
    """Import and return the judge engine class of a ``kind="judge"`` config: the OpenAI-compatible
    one (:data:`OPENAI_JUDGE_ENGINE`) when ``config.judge_url`` is set, else the local judge engine
    of ``config.engine`` (:data:`JUDGE_ENGINES`).

    Raises:
        ValueError: ``config.engine`` has no judge engine; the message lists the choices.
    """
    if config.judge_url is not None:
        return _import(OPENAI_JUDGE_ENGINE)
    try:
        target = JUDGE_ENGINES[config.engine]
    except KeyError:
        raise ValueError(
            f"engine: no judge engine {config.engine!r}; choose one of {', '.join(sorted(JUDGE_ENGINES))}"
        ) from None
    return _import(target)


def _dpo_engine(config: EngineConfig) -> RewardEngine:
    return _import(DPO_ENGINE)(config, logprob_engine=logprob_engine_class(config.engine))


_BUILDERS = {
    DPO_KIND: _dpo_engine,
    JUDGE_KIND: lambda config: judge_engine_class(config)(config),
    LENGTH_KIND: lambda config: _import(LENGTH_ENGINE)(config),
}
"""Model kind → how its engine is built; a kind not listed (``classifier``) gets :data:`ENGINES`."""


def build_engine(config: EngineConfig) -> RewardEngine | JudgeEngine:
    """The (not yet started) engine for ``config``: for ``kind="dpo"`` a
    :class:`~rmserve.server.engines.dpo_pair.DPOEngine` over the log-prob engines of ``config.engine``
    (:data:`LOGPROB_ENGINES`); for ``kind="judge"`` a
    :class:`~rmserve.server.engines.protocol.JudgeEngine` (:func:`judge_engine_class`: the
    OpenAI-compatible engine when ``config.judge_url`` is set, else the local one of
    ``config.engine``); for ``kind="length"`` the tokenizer-only :data:`LENGTH_ENGINE`; else the
    reward engine ``config.engine`` names."""
    builder = _BUILDERS.get(config.kind)
    if builder is not None:
        return builder(config)
    return engine_class(config.engine)(config)
