"""Engine configuration: one frozen dataclass, validated on construction.

Every field but ``model`` is an option of ``rmserve serve`` and ``rmserve run`` (``max_num_seqs``
→ ``--max-num-seqs``; the attribute docstring is its help; see :mod:`rmserve.cli_common`), so
adding an engine option is adding a field here.
No torch or vllm import here: the CLI and the HTTP layer build this object without loading
an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rmserve.errors import ServerFault
from rmserve.schema import (
    CLASSIFIER_KIND,
    DPO_KIND,
    HEAD_NAMES,
    JUDGE_KIND,
    LENGTH_KIND,
    LM_LOGIT_HEAD,
    MODEL_KINDS,
    MULTI_LABEL_HEAD,
    HeadName,
    ModelKind,
    RewardHead,
)
from rmserve.server.kinds.heads import HeadSettings, parse_label_weights

if TYPE_CHECKING:
    from rmserve.server.sharing.auth import UserLine

DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
"""Accepted ``dtype`` values. ``auto`` = bfloat16 on a CUDA device, float32 otherwise."""

EngineKind = Literal["vllm", "hf"]


LengthSign = Literal["longest", "shortest"]
"""Length baseline: ``longest`` rewards a response by its token count, ``shortest`` by minus it."""

JudgeProtocolChoice = Literal["auto", "ranking", "ratings", "pairwise"]
"""Judge protocol: ``auto`` = by benchmark (RewardBench 2: 4-way ranking, Ties rated; RM-Bench:
pairwise); ``ranking`` / ``ratings`` for RewardBench 2 (Ties is always rated); ``pairwise`` for
RM-Bench (rmserve's own protocol)."""

RefFreeMode = Literal["avg", "sum", "norm"]
"""Reference-free DPO rewards over the answer tokens' log-probs: mean, sum, or minus the L2 norm
(allenai/reward-bench ``rewardbench/dpo.py``, ``get_batch_logps``)."""

SchedulingPolicy = Literal["fcfs", "priority"]
"""vLLM's scheduling policy: ``fcfs`` (arrival order) or ``priority`` (lower request priority
first, then arrival; rmserve sends 0 for interactive and 1 for batch work)."""

JudgeThinking = Literal["on", "off"]
"""A judge's thinking switch: passed to the chat template as ``enable_thinking`` (Qwen3-style templates)."""

CompatMode = Literal["none", "official"]
"""``official`` reproduces the official script's defects for comparison; ``none`` computes correctly."""


def resolve_dtype(dtype: str, cuda_available: bool | None = None) -> str:
    """The dtype a server computes in: ``dtype`` itself, or for ``auto`` bfloat16 when CUDA is
    available and float32 otherwise.

    ``cuda_available`` None asks torch (imported here, and only when ``dtype`` is ``auto``).

    Raises:
        ValueError: ``dtype`` is not one of :data:`DTYPES`.
        ImportError: ``dtype`` is ``auto``, ``cuda_available`` is None and torch is not installed.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    return "bfloat16" if cuda_available else "float32"


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run the reward model.

    Raises:
        ValueError: from ``__post_init__``, naming the field, the value and the limit.
    """

    model: str
    """Local checkpoint folder or hub id: a reward model (kind ``classifier``: a ``*ForSequenceClassification``, or a causal LM read at one logit with ``head`` ``lm-logit``), a causal LM policy (kind ``dpo``), a chat model (kind ``judge``) or any model whose tokenizer counts the tokens (kind ``length``: only the tokenizer is loaded)."""

    kind: ModelKind = CLASSIFIER_KIND
    """What the model is: ``classifier`` (a reward head, see --head), ``dpo`` (a policy scored by its implicit reward; needs --ref-model or --ref-free), ``judge`` (a chat model that ranks, rates or compares the answers) or ``length`` (the length baseline: reward = the response's token count, see --length-sign)."""

    head: HeadName | None = None
    """Classifier only: the head the reward is read from: ``classifier`` (the one label of a *ForSequenceClassification), ``multi-label`` (a *ForSequenceClassification with num_labels > 1, read with label_index or label_weights) ``lm-logit`` (a *ForCausalLM: the LM-head logit of head_token_id at the last position, as Llama-3.1-Nemotron-70B-Reward-HF) ``remote-code`` (the checkpoint's own reward model class, auto_map; with trust_remote_code, transformers engine) ``token-value`` (a per-token value model, Qwen2ForRewardModel: the value at the last token; vLLM engine) ``reward-token`` (InternLM2ForRewardModel: the value at its reward_token_id, appended to every sequence; vLLM engine, --trust-remote-code for its config class) ``mlp-value`` (a two-layer MLP score head, score.0 and score.2, as INF-ORM-Llama3.1-70B's INFORMForSequenceClassification; transformers engine) ``value-head`` (a value head v_head.summary over a decoder, as the GRM reward models' GRewardModel; transformers engine) or ``label-distribution`` (a decoder with regression_layer.pt and gating_layer.pt beside it, as LDL-Reward-Gemma-2-27B: the expected score of the gated mixture of the objectives' score distributions; transformers engine). None = found from the checkpoint's config (token-value for Qwen2ForRewardModel, reward-token for InternLM2ForRewardModel, mlp-value for INFORMForSequenceClassification, value-head for GRewardModel, remote-code when its auto_map names a classifier class, else classifier or multi-label by its label count; a causal LM needs --head lm-logit)."""

    label_index: int | None = None
    """Multi-label head only: the label whose logit is the reward (≥ 0; below the checkpoint's num_labels, 0-based)."""

    label_weights: str | None = None
    """Multi-label head only: one weight per label, comma-separated in label order (0.5,0.3,0.2); the reward is the weighted sum of the labels' logits."""

    head_token_id: int | None = None
    """lm-logit head only: the vocabulary id whose LM-head logit at the last position is the reward (≥ 0; below the checkpoint's vocab_size). None = 0, the id Llama-3.1-Nemotron-70B-Reward-HF reads."""

    trust_remote_code: bool = False
    """Classifier only: let the transformers engine run a checkpoint's own modeling code (its ``auto_map`` reward model class, as ArmoRM ships): the remote-code head; and let a reward-token model (InternLM2ForRewardModel) load its own config class on vLLM. Recorded in the fingerprint (with the code files) and the start log. Off unless given: such a checkpoint is refused at start and in a swap, naming this flag."""

    ref_model: str | None = None
    """DPO only: folder or hub id of the reference model (same tokenizer as the policy). Reward = sum of the answer's log-probs under the policy minus under the reference."""

    ref_free: RefFreeMode | None = None
    """DPO only, without a reference model: reward = ``avg`` (mean answer-token log-prob, the official default), ``sum``, or ``norm`` (minus the L2 norm of the per-token log-probs)."""

    compat: CompatMode = "none"
    """``official`` reproduces the official scripts: for DPO a BOS prepended even when the template writes one (the EOS in its place for a tokenizer without BOS), and its truncation (2048 tokens, keeping the prompt's last 128); for a judge the official ranking reader (the first of [[A]], [[B]], [[C]], [[D]] in letter order found anywhere in the text) and rating reader. ``none``: what the template writes, the tokenizer's BOS added only where it has one and the template wrote none; no silent truncation; a judge's verdict is the one its answer concludes with."""

    protocol: JudgeProtocolChoice = "auto"
    """Judge only: ``auto`` (RewardBench 2: 4-way ranking, Ties rated; RM-Bench: pairwise), ``ranking`` or ``ratings`` (RewardBench 2; Ties is always rated), ``pairwise`` (RM-Bench)."""

    judge_max_tokens: int = 2048
    """Judge only: most tokens generated per judge call (≥ 1; official 2048); an output cut there counts as unparsed."""

    judge_seed: int = 0
    """Judge only: seed (≥ 0) of the 4-way ranking's answer positions, recorded with every verdict so a run repeats exactly."""

    judge_url: str | None = None
    """Judge only: base URL of an OpenAI-compatible API (ending in ``/v1``) to judge with instead of a local model; MODEL (or ``judge_model``) names the model there."""

    judge_model: str | None = None
    """Judge only, with ``judge_url``: the model name at the endpoint; None = MODEL."""

    judge_api_key_env: str = "RMSERVE_JUDGE_API_KEY"
    """Judge only, with ``judge_url``: environment variable holding the endpoint's API key (sent as a bearer token; unset = no key)."""

    judge_system_prompt: bool = True
    """Judge only: send the ranking instructions as a system message; with ``--no-judge-system-prompt`` they are merged into the user turn (official ``--no_system_prompt``, for chat templates without a system role)."""

    judge_thinking: JudgeThinking | None = None
    """Judge only: the chat template's thinking switch for judges whose template has one (Qwen3-style ``enable_thinking``): ``on`` or ``off``, passed to a local template as ``enable_thinking`` and to an endpoint as ``chat_template_kwargs``. None = not passed (the template's default). Verdicts are read after the reasoning either way."""

    length_sign: LengthSign = "longest"
    """Length only: ``longest`` (reward = the response's token count, so longer answers win) or ``shortest`` (minus the count)."""

    engine: EngineKind = "vllm"
    """Backend name: ``vllm`` (embedded AsyncLLM, prefix cache) or ``hf`` (transformers)."""

    dtype: str = "auto"
    """Compute dtype: ``auto`` (bfloat16 on GPU, float32 on CPU), ``float32``, ``bfloat16``, ``float16``."""

    max_model_len: int | None = None
    """Longest scored sequence in tokens, template included (≥ 16); None = the model's own limit."""

    block_size: int | None = None
    """KV-cache block size in tokens (vLLM); prefix sharing happens in whole blocks. A power of 2 (8 to 256); None = 16 on GPU, 32 on the CPU build (its attention needs a multiple of 32, and its own default of 128 shares little of short prompts)."""

    gpu_memory_utilization: float = 0.9
    """Fraction of accelerator memory vLLM may use, in (0, 1]."""

    kv_cache_memory_bytes: int | None = None
    """Explicit KV-cache size in bytes (≥ 1048576, 1 MiB) for vLLM; overrides ``gpu_memory_utilization`` for the cache. None = vLLM's choice on GPU; on the CPU build ``VLLM_CPU_KVCACHE_SPACE`` GiB when set, else 4294967296 (4 GiB)."""

    tensor_parallel_size: int = 1
    """Number of accelerators vLLM shards the model over (≥ 1)."""

    data_parallel_size: int = 1
    """Number of model replicas (≥ 1): vLLM data parallel ranks, each over tensor_parallel_size accelerators. Every sequence of a group goes to one rank, so the group's shared prompt is computed once."""

    scheduling_policy: SchedulingPolicy = "fcfs"
    """vLLM's scheduling policy: fcfs (arrival order) or priority (interactive evals before batch sweeps, by the X-RMServe-Priority header)."""

    chat_template: Path | None = None
    """Jinja chat-template file replacing the tokenizer's own; None = the model's template."""

    enforce_eager: bool = False
    """Run vLLM without CUDA graphs / compilation (slower, starts faster)."""

    served_model_name: str | None = None
    """Name reported in ``/v1/models`` and score replies; None = the model path's last part or the hub id."""

    hf_batch_size: int = 8
    """Most sequences per forward pass in the transformers engine (≥ 1): a pass takes the oldest waiting
    sequence and those of the nearest lengths, across the groups in flight."""

    enable_prefix_caching: bool = True
    """Reuse the KV blocks of shared prefixes across sequences (vLLM). Off only to measure what the prefix cache saves."""

    max_num_batched_tokens: int | None = None
    """Most tokens the vLLM scheduler packs into one engine step (≥ 16); None = vLLM's default (2048 on the CPU build)."""

    max_num_seqs: int | None = None
    """Most sequences in one vLLM engine step (≥ 1); None = vLLM's default."""

    cpu_threads_bind: str | None = None
    """CPU build only: the CPU ids the engine's compute threads run on, as ``0-3`` or ``0,2`` (``nobind`` = no pinning), one list per rank joined by ``|`` with several ranks (``0|1``); None = ``VLLM_CPU_OMP_THREADS_BIND`` when set, else every CPU this process may use. vLLM's own default keeps one CPU idle for its scheduler, which halves a 2-core machine."""

    def __post_init__(self) -> None:
        from rmserve.server.engines.registry import ENGINES  # light module: only strings

        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model: must be a non-empty path or hub id")
        if self.engine not in ENGINES:
            raise ValueError(f"engine: {self.engine!r} is not one of {', '.join(sorted(ENGINES))}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.max_model_len is not None and (not _is_int(self.max_model_len) or self.max_model_len < 16):
            raise ValueError(f"max_model_len: {self.max_model_len!r} must be an integer ≥ 16 (or None)")
        if self.block_size is not None and (
            not _is_int(self.block_size) or not 8 <= self.block_size <= 256 or self.block_size & (self.block_size - 1)
        ):
            raise ValueError(f"block_size: {self.block_size!r} must be a power of 2 between 8 and 256")
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: {self.gpu_memory_utilization!r} must be in (0, 1]")
        if self.kv_cache_memory_bytes is not None and (
            not _is_int(self.kv_cache_memory_bytes) or self.kv_cache_memory_bytes < 1 << 20
        ):
            raise ValueError(f"kv_cache_memory_bytes: {self.kv_cache_memory_bytes!r} must be an integer ≥ 1 MiB (1048576)")
        if not _is_int(self.tensor_parallel_size) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: {self.tensor_parallel_size!r} must be an integer ≥ 1")
        if not _is_int(self.data_parallel_size) or self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size: {self.data_parallel_size!r} must be an integer ≥ 1")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy: {self.scheduling_policy!r} is not one of fcfs, priority")
        if self.chat_template is not None:
            path = Path(self.chat_template)
            if not path.is_file():
                raise ValueError(f"chat_template: {str(path)!r} is not a file")
            object.__setattr__(self, "chat_template", path)
        if not _is_int(self.hf_batch_size) or self.hf_batch_size < 1:
            raise ValueError(f"hf_batch_size: {self.hf_batch_size!r} must be an integer ≥ 1")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching: {self.enable_prefix_caching!r} must be true or false")
        for field in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, field)
            low = 16 if field == "max_num_batched_tokens" else 1
            if value is not None and (not _is_int(value) or value < low):
                raise ValueError(f"{field}: {value!r} must be an integer ≥ {low} (or None)")
        if self.cpu_threads_bind is not None and not _valid_cpu_list(self.cpu_threads_bind):
            raise ValueError(
                f"cpu_threads_bind: {self.cpu_threads_bind!r} must be CPU ids such as '0-3' or '0,2' (or 'nobind'),"
                " one list per rank joined by '|' ('0|1') with several ranks"
            )
        ranks = self.data_parallel_size * self.tensor_parallel_size
        if self.cpu_threads_bind not in (None, "nobind"):
            lists = self.cpu_threads_bind.count("|") + 1
            if lists != ranks:
                raise ValueError(
                    f"cpu_threads_bind: {self.cpu_threads_bind!r} has {lists} CPU lists; it needs one per rank,"
                    f" data_parallel_size × tensor_parallel_size = {ranks}"
                )
        if self.served_model_name is not None and not self.served_model_name:
            raise ValueError("served_model_name: must be non-empty when given")
        self._check_kind()

    def _check_kind(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {', '.join(MODEL_KINDS)}")
        if self.length_sign not in ("longest", "shortest"):
            raise ValueError(f"length_sign: {self.length_sign!r} is not one of longest, shortest")
        if self.kind != LENGTH_KIND and self.length_sign != "longest":
            raise ValueError("length_sign: only for kind length; add --kind length or drop --length-sign")
        self._check_judge()
        self._check_head()
        if self.ref_free is not None and self.ref_free not in ("avg", "sum", "norm"):
            raise ValueError(f"ref_free: {self.ref_free!r} is not one of avg, sum, norm")
        if self.compat not in ("none", "official"):
            raise ValueError(f"compat: {self.compat!r} is not one of none, official")
        if self.kind != DPO_KIND:
            for name in ("ref_model", "ref_free"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only for kind dpo; add --kind dpo or drop --{name.replace('_', '-')}")
            return
        if (self.ref_model is None) == (self.ref_free is None):
            raise ValueError(
                "ref_model / ref_free: kind dpo needs exactly one: --ref-model REF (reward = policy minus "
                "reference log-probs) or --ref-free avg|sum|norm"
            )
        if self.ref_model is not None and not self.ref_model:
            raise ValueError("ref_model: must be a non-empty path or hub id")

    def _check_head(self) -> None:
        """The head options: names and ranges, one label rule at most, each with its head, kind
        classifier only (the checkpoint's label count and vocabulary are checked at start)."""
        given = [name for name in ("head", "label_index", "label_weights", "head_token_id") if getattr(self, name) is not None]
        if not isinstance(self.trust_remote_code, bool):
            raise ValueError(f"trust_remote_code: {self.trust_remote_code!r} must be true or false")
        if self.trust_remote_code:
            given.append("trust_remote_code")
        if given and self.kind != CLASSIFIER_KIND:
            raise ValueError(
                f"{' / '.join(given)}: only for kind classifier (a reward head); drop "
                f"{', '.join('--' + name.replace('_', '-') for name in given)} or use --kind classifier"
            )
        if self.head is not None and self.head not in HEAD_NAMES:
            raise ValueError(f"head: {self.head!r} is not one of {', '.join(HEAD_NAMES)}")
        if self.label_index is not None and (not _is_int(self.label_index) or self.label_index < 0):
            raise ValueError(f"label_index: {self.label_index!r} must be an integer ≥ 0")
        if self.head_token_id is not None and (not _is_int(self.head_token_id) or self.head_token_id < 0):
            raise ValueError(f"head_token_id: {self.head_token_id!r} must be an integer ≥ 0")
        if self.label_weights is not None:
            if not isinstance(self.label_weights, str):
                raise ValueError(f"label_weights: {self.label_weights!r} must be weights separated by commas")
            parse_label_weights(self.label_weights)
        if self.label_index is not None and self.label_weights is not None:
            raise ValueError(
                "label_index / label_weights: give one: --label-index I reads one label, --label-weights w1,... "
                "their weighted sum"
            )
        labelled = "label_index" if self.label_index is not None else "label_weights" if self.label_weights is not None else None
        if labelled is not None and self.head not in (None, MULTI_LABEL_HEAD):
            raise ValueError(
                f"{labelled}: only for the {MULTI_LABEL_HEAD} head (num_labels > 1); --head {self.head} reads "
                f"{'one label' if self.head != LM_LOGIT_HEAD else 'one vocabulary logit'}"
            )
        if self.head_token_id is not None and self.head != LM_LOGIT_HEAD:
            raise ValueError(f"head_token_id: only with --head {LM_LOGIT_HEAD} (a causal LM read at one vocabulary logit)")

    @property
    def head_settings(self) -> HeadSettings:
        """The head options as :class:`~rmserve.server.kinds.heads.HeadSettings` (weights parsed)."""
        weights = None if self.label_weights is None else parse_label_weights(self.label_weights)
        return HeadSettings(choice=self.head, label_index=self.label_index, label_weights=weights,
                            token_id=self.head_token_id, trust_remote_code=self.trust_remote_code)

    def _check_judge(self) -> None:
        if self.protocol not in ("auto", "ranking", "ratings", "pairwise"):
            raise ValueError(f"protocol: {self.protocol!r} is not one of auto, ranking, ratings, pairwise")
        if not _is_int(self.judge_max_tokens) or self.judge_max_tokens < 1:
            raise ValueError(f"judge_max_tokens: {self.judge_max_tokens!r} must be an integer ≥ 1")
        if not _is_int(self.judge_seed) or self.judge_seed < 0:
            raise ValueError(f"judge_seed: {self.judge_seed!r} must be an integer ≥ 0")
        if not isinstance(self.judge_system_prompt, bool):
            raise ValueError(f"judge_system_prompt: {self.judge_system_prompt!r} must be true or false")
        if self.judge_thinking is not None and self.judge_thinking not in ("on", "off"):
            raise ValueError(f"judge_thinking: {self.judge_thinking!r} is not one of on, off")
        if self.kind != JUDGE_KIND:
            if (
                self.protocol != "auto" or self.judge_url is not None or self.judge_model is not None
                or self.judge_thinking is not None
            ):
                raise ValueError(
                    "protocol / judge_url / judge_model / judge_thinking: only for kind judge; add --kind judge or "
                    "drop them"
                )
            return
        if self.judge_url is not None and not self.judge_url.startswith(("http://", "https://")):
            raise ValueError(f"judge_url: {self.judge_url!r} must start with http:// or https://")
        if self.judge_model is not None and (self.judge_url is None or not self.judge_model):
            raise ValueError("judge_model: a non-empty model name, only with --judge-url")
        if not self.judge_api_key_env:
            raise ValueError("judge_api_key_env: must name an environment variable")

    @property
    def dpo_mode(self) -> str | None:
        """DPO reward mode: ``reference`` or the reference-free mode; None for a classifier."""
        if self.kind != DPO_KIND:
            return None
        return "reference" if self.ref_model is not None else self.ref_free

    @property
    def name(self) -> str:
        """The served model name: ``served_model_name``, else the folder name or the hub id."""
        if self.served_model_name:
            return self.served_model_name
        path = Path(self.model)
        return path.name if path.exists() else self.model

    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved (:func:`resolve_dtype`; imports torch for ``auto``)."""
        return resolve_dtype(self.dtype)


MODEL_SPEC_KEYS: tuple[str, ...] = ("gpu_memory_utilization", "kv_cache_memory_bytes")
"""Engine options a ``--model NAME=PATH,key=value`` spec may set for its model alone."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of a server serving several: ``--model NAME=PATH[,gpu_memory_utilization=F][,kv_cache_memory_bytes=N]``.

    Attributes:
        name: the name requests use (``ScoreRequest.model``) and ``/v1/models`` reports.
        path: checkpoint folder or hub id.
        gpu_memory_utilization: this model's fraction of accelerator memory; None = its even
            share of the server's ``--gpu-memory-utilization`` (see :func:`node_engine_configs`).
        kv_cache_memory_bytes: this model's KV-cache bytes; None = its even share of the
            server's ``--kv-cache-memory-bytes`` when that is given, else vLLM's choice.
    """

    name: str
    path: str
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``NAME=PATH[,key=value…]`` (keys: :data:`MODEL_SPEC_KEYS`, with ``_`` or ``-``).

        Raises:
            ValueError: no ``=``, an empty name or path, a name with ``,`` / ``=`` / spaces, an
                unknown key, or a value that is not a number (the message quotes the spec).
        """
        name, sep, rest = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--model {text!r}: expected NAME=PATH (e.g. rm-a=/ckpts/a), optionally "
                             f"followed by ,{'=…,'.join(MODEL_SPEC_KEYS)}=…")
        if any(c in name for c in ", \t"):
            raise ValueError(f"--model {text!r}: the name {name!r} may not contain commas or spaces")
        path, *options = rest.split(",")
        if not path.strip():
            raise ValueError(f"--model {text!r}: the path after {name}= is empty")
        values: dict[str, object] = {}
        for option in options:
            key, eq, value = option.partition("=")
            key = key.strip().replace("-", "_")  # the flag's spelling (gpu-memory-utilization) or the field's
            if key not in MODEL_SPEC_KEYS or not eq:
                raise ValueError(f"--model {text!r}: {option!r} is not key=value with a key among {', '.join(MODEL_SPEC_KEYS)}")
            try:
                values[key] = float(value) if key == "gpu_memory_utilization" else int(value)
            except ValueError:
                raise ValueError(f"--model {text!r}: {key}={value!r} is not a number") from None
        return cls(name=name, path=path.strip(), **values)  # type: ignore[arg-type]


def node_engine_configs(base: EngineConfig, specs: tuple[ModelSpec, ...] | list[ModelSpec]) -> list[EngineConfig]:
    """One :class:`EngineConfig` per model of a server serving several: ``base`` (the shared
    engine options) with the spec's path, name and memory share.

    Memory: a model without its own ``gpu_memory_utilization`` gets an even share of what
    the explicit ones leave of ``base.gpu_memory_utilization`` (the node's total, e.g. 0.9 over
    two models: 0.45 each); likewise ``kv_cache_memory_bytes`` when ``base`` sets it.

    Raises:
        ValueError: no spec; two specs with the same name; per-model fractions summing past
            ``base.gpu_memory_utilization`` (naming the field and the sum); a judge served
            through ``judge_url`` (an endpoint is not a model of this node); and any
            :class:`EngineConfig` check of a model's values.
    """
    import dataclasses

    if not specs:
        raise ValueError("--model: give at least one NAME=PATH")
    names = [spec.name for spec in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"--model: the names {duplicates} are given more than once; each model needs its own name")
    if base.judge_url is not None:
        raise ValueError("--model NAME=PATH: not with --judge-url (an endpoint is not a model of this server)")
    fractions = {}
    given = [s.gpu_memory_utilization for s in specs if s.gpu_memory_utilization is not None]
    left = base.gpu_memory_utilization - sum(given)
    rest = len(specs) - len(given)
    if sum(given) > base.gpu_memory_utilization + 1e-9 or (rest and left <= 0):
        raise ValueError(
            f"gpu_memory_utilization: the models' own fractions sum to {sum(given):.3g}, which leaves "
            f"{max(left, 0):.3g} of the server's {base.gpu_memory_utilization:.3g} for {rest} model(s) without one; "
            "lower them or raise --gpu-memory-utilization"
        )
    kv_given = [s.kv_cache_memory_bytes for s in specs if s.kv_cache_memory_bytes is not None]
    kv_left = base.kv_cache_memory_bytes - sum(kv_given) if base.kv_cache_memory_bytes is not None else None
    if kv_left is not None and len(kv_given) < len(specs) and kv_left < len(specs) - len(kv_given):
        raise ValueError(
            f"kv_cache_memory_bytes: the models' own KV caches take {sum(kv_given)} of the server's "
            f"{base.kv_cache_memory_bytes} bytes, leaving nothing for the others; lower them or raise --kv-cache-memory-bytes"
        )
    configs = []
    for spec in specs:
        fractions[spec.name] = spec.gpu_memory_utilization if spec.gpu_memory_utilization is not None else round(left / rest, 6)
        kv = spec.kv_cache_memory_bytes
        if kv is None and kv_left is not None:
            kv = kv_left // (len(specs) - len(kv_given))
        try:
            configs.append(dataclasses.replace(
                base, model=spec.path, served_model_name=spec.name,
                gpu_memory_utilization=fractions[spec.name], kv_cache_memory_bytes=kv,
            ))
        except ValueError as exc:
            raise ValueError(f"--model {spec.name}: {exc}") from None
    return configs


ENGINE_WINDOW_STEPS = 8
"""Default ``ServerConfig.engine_window_tokens``: this many steps of the engine's token budget."""


def engine_window(config: ServerConfig, step_tokens: int | None) -> int | None:
    """The fair queue's token window (:class:`rmserve.server.sharing.fair_queue.FairQueue`
    ``window_tokens``): ``config.engine_window_tokens`` when set (0: None, no bound), else
    :data:`ENGINE_WINDOW_STEPS` × the engine's ``step_tokens``, else None."""
    if config.engine_window_tokens is not None:
        return config.engine_window_tokens or None
    return ENGINE_WINDOW_STEPS * step_tokens if step_tokens else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_cpu_list(text: object) -> bool:
    """True for ``nobind`` or a comma list of ids and ranges (``0-3,6``), ranges ascending, or
    several such lists joined by ``|`` (one per engine rank: data parallel × tensor parallel)."""
    if not isinstance(text, str):
        return False
    if text == "nobind":
        return True
    for part in text.replace("|", ",").split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and (not high.isdigit() or int(high) < int(low))):
            return False
    return True


def check_reward_head(model: str, head: HeadSettings | None = None, engine: str | None = None) -> RewardHead:
    """Fail fast, before any weight is loaded, unless ``model`` has a head rmserve serves under
    the head settings ``head`` (on ``engine``, a registered engine name, when given); returns
    that head.

    Reads only the model config (a local folder's ``config.json`` as JSON, else transformers
    ``AutoConfig``, imported then; labels counted on ``AutoConfig.to_dict()``); the rule is
    :func:`rmserve.server.swaps.checkpoints.architecture_problem` for kind ``classifier``
    (:func:`rmserve.server.kinds.heads.resolve_head`).

    Returns:
        The :class:`~rmserve.schema.RewardHead` to serve (``CLASSIFIER_REWARD_HEAD``: the one-label classifier).

    Raises:
        ServerFault: unreadable config, or no head rmserve serves: an unknown head (naming the
            architectures, the heads rmserve knows and ``--head``), several labels without
            ``--label-index`` / ``--label-weights`` (naming the label count and both flags), an
            index out of range (naming the label count), a weight count other than the labels'
            (per-token reward heads such as ``*ForRewardModel`` are not served), a checkpoint's own
            modeling code without ``--trust-remote-code`` (naming the flag), or a head ``engine``
            does not serve (naming ``--engine``); the message starts with the quoted ``model``.
    """
    from rmserve.server.kinds.heads import HeadProblem, engine_problem, head_hint, mlp_score_problem, resolve_head

    config = _read_model_config(model, "")
    settings = head or HeadSettings()
    try:
        resolved = resolve_head(config, settings)
    except HeadProblem as problem:
        hint = head_hint(str(problem), config, settings, Path(model) if Path(model).is_dir() else None)
        raise ServerFault(f"{model!r} {problem}{hint}") from None
    problem = mlp_score_problem(resolved, checkpoint_weight_names(model))
    if problem is not None:
        raise ServerFault(f"{model!r} {problem}")
    problem = None if engine is None else engine_problem(resolved, engine)
    if problem is not None:
        raise ServerFault(f"{model!r} has the {resolved.name} head: {problem}")
    return resolved


SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024
"""The largest safetensors header read (the format's own limit, 100 MB)."""


def checkpoint_weight_names(model: str) -> frozenset[str] | None:
    """The tensor names of a local checkpoint folder's safetensors weights, read without
    loading a tensor: ``model.safetensors.index.json``'s ``weight_map``, else each
    ``*.safetensors`` file's header (8 bytes of little-endian length, then JSON). None for a
    hub id, a folder without safetensors weights, or a header that cannot be read (the names
    are then not checked before the load)."""
    import json
    import struct

    folder = Path(model)
    if not folder.is_dir():
        return None
    try:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            return frozenset(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        names: set[str] = set()
        files = sorted(folder.glob("*.safetensors"))
        for file in files:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > min(file.stat().st_size - 8, SAFETENSORS_HEADER_LIMIT):
                    return None  # not a safetensors header
                names.update(k for k in json.loads(handle.read(length)) if k != "__metadata__")
        return frozenset(names) if files else None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _read_model_config(model: str, field: str) -> dict:
    """The config of ``model`` as a mapping: a folder's ``config.json`` read as JSON, else a hub
    id's through transformers ``AutoConfig`` (imported only then; ``to_dict()``).

    Raises:
        ServerFault: unreadable config; the message starts with ``field:`` when ``field`` is given.
    """
    import json

    try:
        folder = Path(model)
        if folder.is_dir():
            config = json.loads((folder / "config.json").read_text(encoding="utf-8-sig"))
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model).to_dict()
    except Exception as exc:  # noqa: BLE001
        where = f"{field}: " if field else ""
        raise ServerFault(f"{where}cannot read the model config of {model!r}: {type(exc).__name__}: {exc}") from exc
    return config if isinstance(config, dict) else {}


def check_lm_head(model: str, field: str, kind: ModelKind = DPO_KIND) -> None:
    """Fail fast, before any weight is loaded, unless ``model`` is a causal LM (kinds ``dpo`` and ``judge``).

    A local folder's ``config.json`` is read as JSON; a hub id's config through transformers
    ``AutoConfig`` (imported only then). The rule is
    :func:`rmserve.server.swaps.checkpoints.architecture_problem` for ``kind``.

    Args:
        model: the policy or reference (folder or hub id).
        field: the config field that named it (``model`` or ``ref_model``), for the message.
        kind: the kind served (``dpo`` or ``judge``), for the message.

    Raises:
        ServerFault: unreadable config, or no ``*ForCausalLM`` / ``*LMHeadModel`` architecture
            (a ``*ForSequenceClassification`` reward model is told to use ``--kind classifier``);
            the message starts with ``field:`` and the quoted ``model``.
    """
    from rmserve.server.swaps.checkpoints import architecture_problem

    config = _read_model_config(model, field)
    problem = architecture_problem(kind, config)
    if problem is not None:
        raise ServerFault(f"{field}: {model!r} {problem}")


# --- the HTTP layer: ServerConfig (the engine has EngineConfig above) -------------------

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Default request body limit: 32 MiB.

Set on purpose (aiohttp's own default is 1 MiB): a request of 64 RM-Bench groups with six
long responses each is a few MiB of JSON; 32 MiB leaves room for long-context benchmarks while
bounding what one request can make the server buffer and decode.
"""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: ``localhost`` or a loopback address
    (127.0.0.0/8, ::1). Other names (which may resolve anywhere) and 0.0.0.0 are not."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of the HTTP layer (the engine has its own ``EngineConfig``).

    Raises:
        ValueError: from ``__post_init__``, naming the field, the value and the limit.
    """

    host: str = "127.0.0.1"
    """Interface to listen on: 127.0.0.1 (this machine only) or 0.0.0.0 (accepts remote clients). Default: 127.0.0.1."""

    port: int = 8000
    """TCP port (0 to 65535; 0 lets the OS pick a free port). Default: 8000."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body accepted, bytes (≥ 1024); larger bodies get 413 body_too_large. Default: 33554432 (32 MiB)."""

    max_inflight_groups: int = 0
    """Most groups admitted at once over all requests (≥ 0); beyond it 429 overloaded; 0 = no limit. Default: 0."""

    served_model_name: str | None = None
    """Name reported in replies and matched against a request's model; None (default) = the engine's name."""

    retry_after_s: int = 5
    """Seconds sent in Retry-After with 503/429 replies (≥ 1); default 5."""

    render_threads: int = 2
    """Threads that decode request bodies, render chat templates and tokenize (≥ 1); default 2."""

    shutdown_timeout_s: float = 10.0
    """Seconds in-flight requests get to finish on shutdown before they are cancelled (≥ 0); default 10."""

    admin_token: str | None = field(default=None, repr=False)
    """Bearer token of POST /v1/models/load; None (default) disables the endpoint (403)."""

    checkpoint_roots: tuple[str, ...] = ()
    """Folders a checkpoint swap may load from (after resolving symlinks); empty = none (403)."""

    swap_wait_s: float = 30.0
    """Seconds a scoring request waits for a checkpoint swap to finish before 503 (≥ 0). Default: 30."""

    result_cache_groups: int = 100_000
    """Recent group results kept (≥ 0; 0 = off) so that a group sent again (a resumed or retrying client) is answered at once, without engine work: the same token ids for the same model fingerprint get the first reply's rewards. Cleared by a checkpoint swap."""

    swap_drain_timeout_s: float = 600.0
    """Seconds a checkpoint swap waits for in-flight scoring to finish (≥ 0); past it the load fails with 503, nothing is loaded and scoring resumes. Default: 600."""

    fair_share: bool = True
    """Put a per-user fair queue (deficit round robin over prompt tokens, scaled by each user's weight) in front of the engine; with ``--no-fair-share`` groups go to the engine in arrival order, uncapped."""

    engine_concurrency_groups: int = 64
    """With fair_share: most groups at the engine at once (≥ 1); the rest wait in their user's queue. Default: 64."""

    engine_window_tokens: int | None = None
    """With fair_share: no further group goes to the engine while those there hold this many prompt tokens (≥ 0; 0 = no such bound). It keeps the engine's own first-come-first-served queue short, so a user's group admitted now does not wait behind a long queue of others'. Default: 8 steps of the engine's scheduler budget (vLLM's max_num_batched_tokens); none for engines without one."""

    fair_share_quantum_tokens: int = 2048
    """With fair_share: prompt tokens a weight-1 user is credited per round of the queue (≥ 1). Default: 2048."""

    fair_share_interactive_boost: float = 2.0
    """With fair_share: factor (≥ 1) on the share of a user whose next group is marked interactive (header X-RMServe-Priority; rmserve eval sends interactive, rmserve sweep batch); 1 = the hint only orders that user's own groups. Default: 2 (an eval gets twice the share of a sweep)."""

    users_file: str | None = None
    """Users file (JSON Lines, one user per line with a hash of the user's token, role and limits; rmserve users add writes it). With it every route but /health, / and /static/ needs Authorization: Bearer <token>. Without it the server has no users and listens on loopback only. Default: none."""

    insecure_no_auth: bool = False
    """Listen on a non-loopback --host without a users file: anyone who reaches the port may score and swap. Default: off."""

    users: tuple[UserLine, ...] = field(default=(), repr=False, compare=False)
    """The records of ``users_file``, read and checked when the config is built (not an option;
    the app is built from them, so it reads no file on the event loop)."""

    lease_idle_s: float = 600.0
    """Seconds a checkpoint lease outlives its holder's last pinned work in flight (> 0); then another user may swap. Default: 600."""

    policy_template: str | None = None
    """POST /get_reward (OpenRLHF): the chat template the policy wrote its queries with, so each is re-templated with the reward model's: a family (chatml: Qwen2/2.5/3; llama3; gemma), a Jinja template FILE of one of those families, or rm (the reward model's own template: queries are tokenized as sent). Without it, queries must already be in the reward model's format (checked when its template is one of those families)."""

    policy_template_text: str | None = field(default=None, repr=False, compare=False)
    """The text of a ``policy_template`` file, read when the config is built (not an option)."""

    policy_family: str | None = field(default=None, repr=False, compare=False)
    """The family of ``policy_template`` (named, or found from the file; not an option)."""

    training_log: str | None = None
    """Append one JSON line per sampled training sample scored through POST /get_reward, /classify or /pooling (time, user, route, model, fingerprint, reward, token count, the SHA-256 of the input; docs/rlhf.md), so a run can show which reward model scored it. Written by a thread; a write error is logged once and never fails a reply. Default: none (off)."""

    training_log_rate: float = 1.0
    """With --training-log: the fraction in [0, 1] of the samples recorded, chosen by the hash of each input (the same samples on every run). Default: 1 (all)."""

    training_log_text: bool = False
    """With --training-log: record each input itself too (the text or token ids), not only its SHA-256. Default: off."""

    replica: str | None = None
    """Set by rmserve cluster: which replica of a Ray replica set this server is (``NAME/INDEX on node IP, GPUs IDS``), shown on the status page and in GET /v1/status. Default: none."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("ServerConfig.host must be a non-empty host name or address")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServerConfig.port is {self.port}; it must be between 0 and 65535")
        if self.max_body_bytes < 1024:
            raise ValueError(f"ServerConfig.max_body_bytes is {self.max_body_bytes}; it must be at least 1024")
        if self.max_inflight_groups < 0:
            raise ValueError(
                f"ServerConfig.max_inflight_groups is {self.max_inflight_groups}; it must be ≥ 0 (0 = no limit)"
            )
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("ServerConfig.served_model_name must be None or a non-empty name")
        if self.retry_after_s < 1:
            raise ValueError(f"ServerConfig.retry_after_s is {self.retry_after_s}; it must be at least 1")
        if self.render_threads < 1:
            raise ValueError(f"ServerConfig.render_threads is {self.render_threads}; it must be at least 1")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"ServerConfig.shutdown_timeout_s is {self.shutdown_timeout_s}; it must be ≥ 0")
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("ServerConfig.admin_token must be None or a non-empty token")
        for root in self.checkpoint_roots:
            if not Path(root).is_dir():
                raise ValueError(f"ServerConfig.checkpoint_roots: {root!r} is not an existing folder")
        if self.result_cache_groups < 0:
            raise ValueError(f"ServerConfig.result_cache_groups is {self.result_cache_groups}; it must be ≥ 0 (0 = off)")
        if self.swap_wait_s < 0:
            raise ValueError(f"ServerConfig.swap_wait_s is {self.swap_wait_s}; it must be ≥ 0")
        if not self.swap_drain_timeout_s >= 0:
            raise ValueError(f"ServerConfig.swap_drain_timeout_s is {self.swap_drain_timeout_s}; it must be ≥ 0")
        if not isinstance(self.fair_share, bool):
            raise ValueError(f"ServerConfig.fair_share is {self.fair_share!r}; it must be true or false")
        for name in ("engine_concurrency_groups", "fair_share_quantum_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServerConfig.{name} is {value!r}; it must be an integer ≥ 1")
        if self.engine_window_tokens is not None and (
            not isinstance(self.engine_window_tokens, int) or isinstance(self.engine_window_tokens, bool)
            or self.engine_window_tokens < 0
        ):
            raise ValueError(
                f"ServerConfig.engine_window_tokens is {self.engine_window_tokens!r}; it must be an integer ≥ 0 (0 = no bound)"
            )
        if not isinstance(self.fair_share_interactive_boost, (int, float)) or not self.fair_share_interactive_boost >= 1:
            raise ValueError(
                f"ServerConfig.fair_share_interactive_boost is {self.fair_share_interactive_boost!r}; it must be ≥ 1"
            )
        if not isinstance(self.lease_idle_s, (int, float)) or not self.lease_idle_s > 0:
            raise ValueError(f"ServerConfig.lease_idle_s is {self.lease_idle_s!r}; it must be > 0 seconds")
        self._read_policy_template()
        self._check_training_log()
        self._check_access()

    def _check_training_log(self) -> None:
        """``training_log`` a file that can be appended to (created empty when missing), the
        rate a fraction; the rate and the text switch only with a file."""
        rate = self.training_log_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"ServerConfig.training_log_rate is {rate!r}; it must be a fraction in [0, 1]")
        if self.training_log is None:
            if rate != 1.0:
                raise ValueError(f"ServerConfig.training_log_rate is {rate!r} but no training log file is given "
                                 "(--training-log FILE)")
            if self.training_log_text:
                raise ValueError("ServerConfig.training_log_text is on but no training log file is given "
                                 "(--training-log FILE)")
            return
        path = Path(self.training_log)
        if path.is_dir():
            raise ValueError(f"ServerConfig.training_log: {self.training_log!r} is a folder; give a file")
        if not path.parent.is_dir():
            raise ValueError(f"ServerConfig.training_log: the folder of {self.training_log!r} does not exist")
        try:
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise ValueError(f"ServerConfig.training_log: cannot append to {self.training_log!r}: {exc}") from None

    def _read_policy_template(self) -> None:
        """``policy_template`` a family, ``rm`` or a template file of a family (read here)."""
        from rmserve.server.render.policy_template import FAMILIES, SAME_AS_RM, family_of_template_file

        name = self.policy_template
        if name is None or name == SAME_AS_RM:
            return
        if name in FAMILIES:
            object.__setattr__(self, "policy_family", name)
            return
        path = Path(name)
        if not path.is_file():
            raise ValueError(
                f"ServerConfig.policy_template: {name!r} is neither a family ({', '.join(FAMILIES)}), "
                f"{SAME_AS_RM!r} (the reward model's own template) nor a template file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"ServerConfig.policy_template: cannot read {name!r}: {exc}") from None
        family = family_of_template_file(text)
        if family is None:
            raise ValueError(
                f"ServerConfig.policy_template: the template {name!r} writes turns in none of the known forms "
                f"({', '.join(FAMILIES)}), so queries written with it cannot be read back; name the family, "
                f"or give {SAME_AS_RM!r} when it is the reward model's own template"
            )
        object.__setattr__(self, "policy_template_text", text)
        object.__setattr__(self, "policy_family", family.name)

    def _check_access(self) -> None:
        """Users file readable and valid; without one, a non-loopback host only when asked for."""
        if self.users_file is not None:
            if self.insecure_no_auth:
                raise ValueError(
                    "ServerConfig.insecure_no_auth is set together with users_file; give one of "
                    "--users-file (tokens required) or --insecure-no-auth (no tokens)"
                )
            from rmserve.server.sharing.auth import UsersFileError, read_users_file

            try:
                users = read_users_file(self.users_file)
            except UsersFileError as exc:
                raise ValueError(f"ServerConfig.users_file: {exc}") from None
            object.__setattr__(self, "users", users)
        elif not self.insecure_no_auth and not is_loopback(self.host):
            raise ValueError(
                f"ServerConfig.host is {self.host!r}, which other machines can reach, and no users file "
                "is given: anyone could score and swap checkpoints. Give --users-file FILE (create it with "
                "rmserve users add NAME --users-file FILE; clients then send their token), or "
                "--insecure-no-auth to serve without tokens anyway"
            )

    @property
    def url(self) -> str:
        """Base URL clients use, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
