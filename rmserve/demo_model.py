"""A tiny random-weight reward model for tests and benchmarks (no download).

:func:`build_demo_model` writes a ``LlamaForSequenceClassification`` checkpoint
(``num_labels=1`` unless asked for more, fp32 safetensors; ``kind="reward"``) or a ``LlamaForCausalLM`` of the same
shape (``kind="causal"``: a policy or reference for DPO scoring; two seeds make a pair), or a
gated multi-objective reward model that ships its own modeling code (``kind="gated"``: the
file ``modeling_gated_rm.py`` beside the weights, named in ``auto_map``, as ArmoRM ships its
class; served with ``--trust-remote-code``), with a byte-level BPE tokenizer trained on a local
corpus and a chat template that starts with BOS and closes every turn with EOS. The weights
are random: the rewards it produces are reproducible numbers with no meaning, which is all
a parity or throughput test needs.

Template layout (``<s>`` = BOS, ``</s>`` = EOS)::

    <s><|system|>\\n{system}</s><|user|>\\n{user}</s><|assistant|>\\n{response}</s>

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmserve.demo_families import FAMILIES, FAMILY_NAMES, Family
from rmserve.errors import DataError


DEMO_FAMILY = FAMILIES["demo"]
BOS_TOKEN = DEMO_FAMILY.bos
EOS_TOKEN = DEMO_FAMILY.eos
PAD_TOKEN = DEMO_FAMILY.pad
ROLE_TOKENS: dict[str, str] = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS: tuple[str, ...] = DEMO_FAMILY.special_tokens
"""Special tokens in id order: pad = 0, BOS = 1, EOS = 2, then the role markers."""

CHAT_TEMPLATE = DEMO_FAMILY.chat_template
"""The demo chat template (Jinja): BOS once, a role marker and newline per turn, EOS after each turn."""

INTERNLM2_CONFIG_FILE = "configuration_internlm2.py"
"""The configuration file an ``internlm2-rm`` demo model ships (``auto_map`` ``AutoConfig``):
``InternLM2Config`` (transformers has none; vLLM implements the architecture)."""

REWARD_TOKEN = "[UNUSED_TOKEN_130]"
"""The special token an ``internlm2-rm`` demo model's reward is read at (``reward_token_id``;
InternLM2's reward models use the token of that name)."""

DEMO_KINDS: tuple[str, ...] = ("reward", "causal", "gated", "qwen2-rm", "internlm2-rm", "inf-orm", "grm", "ldl")
"""The models ``demo-model --head`` builds (:attr:`DemoModelConfig.kind`)."""

QWEN2_RM_CODE_FILE = "modeling_qwen2_rm.py"
"""The modeling file a ``qwen2-rm`` demo model ships (from ``rmserve/demo_code/``), named in its
``auto_map`` (``AutoModel``): ``Qwen2ForRewardModel``, a value per token (transformers has no
such class; vLLM implements the architecture)."""

GATED_CODE_FILE = "modeling_gated_rm.py"
"""The modeling file a ``gated`` demo model ships (from ``rmserve/demo_code/``), named in its
``auto_map``: ``GatedRewardConfig`` and ``GatedRewardModel``."""

RANDOM_WEIGHTS_WARNING = (
    "WARNING: this demo model has RANDOM weights. Its rewards are reproducible numbers "
    "with NO meaning; use it only to test and benchmark the serving path."
)

_CORPUS_SUFFIXES = (".json", ".jsonl", ".txt", ".md")


@dataclass(frozen=True)
class DemoModelConfig:
    """Shape of the demo model.

    Attributes:
        layers: decoder layers (≥ 1).
        hidden: hidden size; ``hidden / heads`` is the head dim, which must be ≥ 32 (the CPU
            attention kernels of vLLM need it).
        heads: attention heads; a multiple of ``kv_heads``.
        kv_heads: key/value heads (grouped-query attention when < ``heads``).
        intermediate: MLP size (≥ 1).
        vocab: tokenizer vocabulary target incl. 256 byte symbols and 6 special tokens (300…65536).
        seed: torch seed for the weights; same seed + same corpus → identical files.
        max_len: ``max_position_embeddings`` and the tokenizer's ``model_max_length`` (≥ 16).
        kind: ``reward`` (a sequence classifier), ``causal`` (a causal LM with an LM head,
            same tokenizer and template: a DPO policy or reference, or an ``lm-logit`` reward head)
            or ``gated`` (:data:`GATED_CODE_FILE`'s model: a Llama decoder, one reward per
            objective from a linear layer at the last token, a softmax gate over them from
            another; reward = Σ gateₖ·rewardₖ; served by the ``remote-code`` head) or
            ``qwen2-rm`` (:data:`QWEN2_RM_CODE_FILE`'s ``Qwen2ForRewardModel``, Qwen2.5-Math-RM's
            shape: a Qwen2 decoder and an MLP value head at every token; family ``qwen2``;
            served by the ``token-value`` head on vLLM) or ``internlm2-rm``
            (``InternLM2ForRewardModel``, internlm2-7b-reward's shape: the ``causal`` Llama of the
            same seed converted to InternLM2's weight layout — ``wqkv`` packed per key/value head,
            ``w1``/``w3``/``w2`` — and a ``v_head`` giving a value per token, read at
            :data:`REWARD_TOKEN`, ``reward_token_id`` in its config; family ``demo``; served by
            the ``reward-token`` head on vLLM with ``--trust-remote-code`` for its config class)
            or ``inf-orm`` (INF-ORM-Llama3.1-70B's shape: the ``reward`` classifier of the same
            seed whose ``score`` layer is replaced by a two-layer MLP — ``score.0`` hidden →
            hidden, ReLU, ``score.2`` hidden → 1, random — and whose architecture is
            ``INFORMForSequenceClassification``, a class no library ships; family ``demo`` or
            ``llama3``; served by the ``mlp-value`` head on the transformers engine) or ``grm``
            (the GRM reward models' shape, ``GRewardModel``: the ``causal`` model of the same seed
            without its LM head and with a value head ``v_head.summary.0`` (hidden → 2·hidden),
            ReLU, ``v_head.summary.2`` (→ 1), random; any family; served by the ``value-head``
            head on the transformers engine) or ``ldl`` (LDL-Reward-Gemma-2-27B's shape: the
            ``causal`` model's decoder, and beside it ``regression_layer.pt`` and
            ``gating_layer.pt``, random regression and gating layers for
            :data:`LDL_OBJECTIVES` objectives, the gate's softmax at temperature
            :data:`LDL_TEMPERATURE`; any family; served with ``--head label-distribution`` on the
            transformers engine).
        num_labels: ``reward`` only: labels of the classifier (1: a one-label reward head; more:
            a multi-label head, served with ``--label-index`` or ``--label-weights``).
        objectives: ``gated`` only: the number of objectives (1 to 64).
        family: the model family (:data:`~rmserve.demo_families.FAMILIES`): its architecture
            class, tokenizer rules (special tokens, BOS/EOS) and chat template; ``demo``
            (Llama, rmserve's own template) by default. ``gated`` is ``demo`` only.

    Raises:
        ValueError: naming the field and the limit.
    """

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 352
    vocab: int = 2000
    seed: int = 0
    max_len: int = 4096
    kind: str = "reward"
    num_labels: int = 1
    objectives: int = 4
    family: str = "demo"

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name}: {value!r} must be an integer ≥ 1")
        need(self.hidden % self.heads == 0, f"hidden: {self.hidden} must be a multiple of heads ({self.heads})")
        need(
            self.hidden // self.heads >= 32,
            f"hidden: head dim hidden/heads = {self.hidden // self.heads} must be ≥ 32 (hidden ≥ {32 * self.heads})",
        )
        need(self.heads % self.kv_heads == 0, f"kv_heads: {self.kv_heads} must divide heads ({self.heads})")
        need(300 <= self.vocab <= 65536, f"vocab: {self.vocab} must be between 300 and 65536")
        need(self.seed >= 0, f"seed: {self.seed} must be ≥ 0")
        need(self.max_len >= 16, f"max_len: {self.max_len} must be ≥ 16")
        need(self.kind in DEMO_KINDS, f"kind: {self.kind!r} must be {', '.join(DEMO_KINDS[:-1])} or {DEMO_KINDS[-1]}")
        need(isinstance(self.num_labels, int) and 1 <= self.num_labels <= 64,
             f"num_labels: {self.num_labels!r} must be an integer from 1 to 64")
        need(self.kind == "reward" or self.num_labels == 1, "num_labels: only for a reward model (head reward)")
        need(isinstance(self.objectives, int) and 1 <= self.objectives <= 64,
             f"objectives: {self.objectives!r} must be an integer from 1 to 64")
        need(self.family in FAMILIES, f"family: {self.family!r} is not one of {', '.join(FAMILY_NAMES)}")
        for kind in ("gated", "internlm2-rm"):
            need(self.kind != kind or self.family == "demo", f"family: an {kind} model is family demo, not {self.family!r}"
                 if kind[0] in "aeiou" else f"family: a {kind} model is family demo, not {self.family!r}")
        need(self.kind != "qwen2-rm" or self.family == "qwen2",
             f"family: a qwen2-rm model is family qwen2, not {self.family!r}")
        need(self.kind != "inf-orm" or self.family in ("demo", "llama3"),
             f"family: an inf-orm model is a Llama, family demo or llama3, not {self.family!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class DemoModelReport:
    """What :func:`build_demo_model` wrote.

    Attributes:
        path: the checkpoint folder.
        num_parameters: parameter count of the model.
        vocab_size: the trained tokenizer's vocabulary size (≤ the requested ``vocab``).
        head_dim: attention head size.
        weights_sha256: sha256 hex of ``model.safetensors``.
    """

    path: Path
    num_parameters: int
    vocab_size: int
    head_dim: int
    weights_sha256: str


def corpus_texts(corpus: Path) -> Iterator[str]:
    """Texts to train the tokenizer on, in a fixed order.

    ``corpus`` is a file or a folder (searched recursively for ``.json``, ``.jsonl``,
    ``.txt``, ``.md``, sorted by path). JSON/JSONL files must hold benchmark records: their
    ``prompt`` (string or message list), ``chosen`` and ``rejected`` strings are used. Other
    files are read as plain UTF-8 text.

    Raises:
        DataError: missing corpus, no usable file, or a JSON record without text fields.
    """
    from rmserve.datasets import read_records

    corpus = Path(corpus)
    if corpus.is_dir():
        files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in _CORPUS_SUFFIXES)
        if not files:
            raise DataError(f"no {', '.join(_CORPUS_SUFFIXES)} files in the corpus folder", path=str(corpus))
    elif corpus.is_file():
        files = [corpus]
    else:
        raise DataError("corpus does not exist", path=str(corpus))
    for path in files:
        if path.suffix.lower() not in (".json", ".jsonl"):
            yield path.read_text(encoding="utf-8")
            continue
        for index, record in enumerate(read_records(path)):
            found = False
            prompt = record.get("prompt")
            if isinstance(prompt, str):
                found = True
                yield prompt
            elif isinstance(prompt, list):
                for turn in prompt:
                    if isinstance(turn, dict) and isinstance(turn.get("content"), str):
                        found = True
                        yield turn["content"]
            for key in ("chosen", "rejected"):
                value = record.get(key)
                values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
                for text in values:
                    if isinstance(text, str):
                        found = True
                        yield text
            if not found:
                raise DataError(
                    "record has no prompt/chosen/rejected text", path=str(path), line=index, field="prompt"
                )


def train_tokenizer(corpus: Path, vocab: int, family: Family = DEMO_FAMILY, extra_tokens: tuple[str, ...] = ()):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on :func:`corpus_texts` with the special
    tokens of ``family``.

    The special tokens get ids 0, 1, … in ``family.special_tokens`` order. For a family whose
    tokenizer adds BOS (``tokenizer_adds_bos``: Llama, Gemma, Mistral), a post-processor puts
    BOS in front of plain ``encode`` calls, so tokenizing a rendered chat text *with* special
    tokens gives two BOS where the template writes one too — the renderer must not do that; a
    family without BOS (Qwen) gets no post-processor. Training is single-pass and
    deterministic for a fixed corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=[*family.special_tokens, *extra_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_texts(corpus), trainer=trainer)
    if family.tokenizer_adds_bos:
        bos = family.bos
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    return tokenizer


def build_demo_model(out: Path, corpus: Path, config: DemoModelConfig = DemoModelConfig()) -> DemoModelReport:
    """Write a random-weight ``LlamaForSequenceClassification`` reward model (``config.kind``
    ``reward``), ``LlamaForCausalLM`` (``causal``) or gated multi-objective reward model with
    its own code (``gated``) to ``out``.

    Files: ``config.json``, ``model.safetensors`` (fp32), ``tokenizer.json``,
    ``tokenizer_config.json`` (with the chat template under ``chat_template``),
    ``README.md`` (says the weights are random); ``gated``: also :data:`GATED_CODE_FILE`, and
    ``config.json`` names its classes in ``auto_map``. Deterministic for a fixed ``config``
    and corpus.

    Raises:
        ValueError: ``out`` exists and is not an empty folder.
        DataError: from :func:`corpus_texts`.
    """
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out: {str(out)!r} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)

    family = FAMILIES[config.family]
    raw = train_tokenizer(corpus, config.vocab, family, (REWARD_TOKEN,) if config.kind == "internlm2-rm" else ())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        model_max_length=config.max_len,
        padding_side="right",
        chat_template=family.chat_template,
    )
    ids = {tok: raw.token_to_id(tok) for tok in family.special_tokens}
    config_name, classifier_name, causal_name = family.class_names()
    config_class = getattr(transformers, config_name)
    model_class = getattr(transformers, classifier_name if config.kind in ("reward", "inf-orm") else causal_name)
    extra = dict(family.config)
    if family.architecture == "Gemma2":
        extra["query_pre_attn_scalar"] = config.head_dim  # the scaling 1/sqrt(head_dim), as Gemma 2's 2B and 9B
    if config.kind == "gated":
        module = _shipped_module(out, GATED_CODE_FILE)
        config_class, model_class = module.GatedRewardConfig, module.GatedRewardModel
        extra["num_objectives"] = config.objectives
    if config.kind == "qwen2-rm":
        model_class = _shipped_module(out, QWEN2_RM_CODE_FILE).Qwen2ForRewardModel
    fields = dict(
        vocab_size=raw.get_vocab_size(),
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_len,
        rms_norm_eps=1e-6,
        bos_token_id=ids[family.bos] if family.bos is not None else None,
        eos_token_id=ids[family.eos],
        pad_token_id=ids[family.pad],
        num_labels=config.num_labels,
        tie_word_embeddings=False,
        architectures=[model_class.__name__],
    )
    model_config = config_class(**{**fields, **extra})
    model_config.dtype = "float32"

    torch.manual_seed(config.seed)
    with torch.device("cpu"):
        model = model_class(model_config).to(torch.float32).eval()
        if config.kind == "gated":
            # transformers' initialisation (std 0.02) makes the gate all but uniform, and the reward
            # the plain mean of the objectives; gate logits of order 1 make the gating matter
            with torch.no_grad():
                model.gating.weight.normal_(std=2.0 / config.hidden**0.5)
        if config.kind == "qwen2-rm":
            # rewards of order 1 (std 0.02 would give values of order 0.01)
            with torch.no_grad():
                for layer in (model.score[0], model.score[2]):
                    layer.weight.normal_(std=2.0 / config.hidden**0.5)
    model.save_pretrained(out)
    if getattr(model_config, "tie_word_embeddings", False):
        _drop_tied_lm_head(out)
    tokenizer.save_pretrained(out)
    _inline_chat_template(out, family.chat_template)
    if config.kind == "gated":
        _name_code_in_config(out, GATED_CODE_FILE, {"AutoConfig": config_class.__name__,
                                                    "AutoModelForSequenceClassification": model_class.__name__})
    if config.kind == "qwen2-rm":
        _name_code_in_config(out, QWEN2_RM_CODE_FILE, {"AutoModel": model_class.__name__})
    written = {"grm": "GRewardModel", "ldl": model_class.__name__.replace("ForCausalLM", "Model")}.get(
        config.kind, model_class.__name__)  # the class config.json names once the checkpoint is rewritten
    family_line = "" if family.name == "demo" else f"Family {family.name} ({written}, its tokenizer rules and chat template).\n\n"
    title = {"reward": "reward model", "causal": "causal LM (a DPO policy or reference)",
             "gated": f"gated reward model with its own code ({GATED_CODE_FILE}; serve with --trust-remote-code)",
             "qwen2-rm": f"per-token reward model, Qwen2ForRewardModel ({QWEN2_RM_CODE_FILE}; served on vLLM)",
             "internlm2-rm": f"reward model read at a reward token, InternLM2ForRewardModel ({INTERNLM2_CONFIG_FILE}; "
                             "served on vLLM with --trust-remote-code)",
             "inf-orm": "reward model with an MLP score head, INFORMForSequenceClassification (served with --engine hf)",
             "grm": "reward model with a value head, GRewardModel as GRM's (served with --engine hf)",
             "ldl": "reward model with a label-distribution head as LDL-Reward's (served with --head label-distribution "
                    "--engine hf)",
             }[config.kind]
    (out / "README.md").write_text(
        f"# rmserve demo {title}\n\n{RANDOM_WEIGHTS_WARNING}\n\n{family_line}"
        f"Shape: {config.layers} layers, hidden {config.hidden}, {config.heads} heads "
        f"({config.kv_heads} KV heads, head dim {config.head_dim}), intermediate {config.intermediate}, "
        f"vocab {raw.get_vocab_size()}, max length {config.max_len}, seed {config.seed}.\n",
        encoding="utf-8",
    )
    if config.kind == "internlm2-rm":
        _as_internlm2_reward_model(out, raw.token_to_id(REWARD_TOKEN), config)
    if config.kind == "inf-orm":
        _as_mlp_value_model(out, config)
    if config.kind == "grm":
        _as_value_head_model(out, config)
    if config.kind == "ldl":
        _as_label_distribution_model(out, config)
    weights = out / "model.safetensors"
    return DemoModelReport(
        path=out,
        num_parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=raw.get_vocab_size(),
        head_dim=config.head_dim,
        weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
    )


def _as_internlm2_reward_model(out: Path, reward_token_id: int, config: DemoModelConfig) -> None:
    """Rewrite the causal Llama in ``out`` as an ``InternLM2ForRewardModel`` checkpoint: the
    decoder's tensors under InternLM2's names (per key/value head ``h``, ``wqkv`` rows hold the
    ``q`` rows of the query heads of group ``h``, then ``h``'s ``k`` rows, then its ``v`` rows,
    as vLLM's ``InternLM2Attention.split_qkv`` reads them), a random ``v_head`` (hidden → 1), no
    LM head, and a ``config.json`` naming :data:`INTERNLM2_CONFIG_FILE`'s class in ``auto_map``
    with ``reward_token_id``."""
    import importlib.resources

    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(out / "model.safetensors"))
    hidden, kv_heads, head_dim = config.hidden, config.kv_heads, config.head_dim
    group = config.heads // kv_heads
    new = {"model.tok_embeddings.weight": weights["model.embed_tokens.weight"],
           "model.norm.weight": weights["model.norm.weight"]}
    names = {"self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}
    for i in range(config.layers):
        p = f"model.layers.{i}."
        q = weights[p + "self_attn.q_proj.weight"].view(kv_heads, group, head_dim, hidden)
        k = weights[p + "self_attn.k_proj.weight"].view(kv_heads, 1, head_dim, hidden)
        v = weights[p + "self_attn.v_proj.weight"].view(kv_heads, 1, head_dim, hidden)
        new[p + "attention.wqkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        for llama, internlm in names.items():
            new[f"{p}{internlm}.weight"] = weights[f"{p}{llama}.weight"]
    generator = torch.Generator().manual_seed(config.seed + 1)
    new["v_head.weight"] = torch.randn(1, hidden, generator=generator) * (2.0 / hidden**0.5)  # rewards of order 1
    save_file({k: t.contiguous() for k, t in new.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / INTERNLM2_CONFIG_FILE).write_bytes(
        (importlib.resources.files("rmserve") / "demo_code" / INTERNLM2_CONFIG_FILE).read_bytes())
    llama = json.loads((out / "config.json").read_text(encoding="utf-8"))
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
              "pad_token_id")
    data = {name: llama[name] for name in fields}
    data.update(architectures=["InternLM2ForRewardModel"], model_type="internlm2", hidden_act="silu",
                rope_theta=10000.0, bias=False, tie_word_embeddings=False, reward_token_id=reward_token_id,
                dtype="float32", auto_map={"AutoConfig": f"{INTERNLM2_CONFIG_FILE.removesuffix('.py')}.InternLM2Config"})
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "generation_config.json").unlink(missing_ok=True)


@contextlib.contextmanager
def _config_json(out: Path) -> Iterator[dict]:
    """``out/config.json`` as a dict to edit in the ``with`` block; written back (sorted keys) after it."""
    path = out / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    yield data
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _safetensors_weights(out: Path) -> Iterator[dict]:
    """``out/model.safetensors`` as a name → tensor dict to edit in the ``with`` block; written back after it."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    weights = load_file(str(path))
    yield weights
    save_file({k: t.contiguous() for k, t in weights.items()}, str(path), metadata={"format": "pt"})


def _as_mlp_value_model(out: Path, config: DemoModelConfig) -> None:
    """Rewrite the one-label classifier in ``out`` as INF-ORM's shape: its ``score.weight``
    replaced by ``score.0`` (hidden → hidden, with bias) and ``score.2`` (hidden → 1, with
    bias), random (seed ``config.seed + 1``, of a size that gives rewards of order 1), and
    ``config.json``'s architecture ``INFORMForSequenceClassification``."""
    import torch

    with _safetensors_weights(out) as weights:
        del weights["score.weight"]
        hidden = config.hidden
        generator = torch.Generator().manual_seed(config.seed + 1)
        scale = 2.0 / hidden**0.5
        weights["score.0.weight"] = torch.randn(hidden, hidden, generator=generator) * scale
        weights["score.0.bias"] = torch.randn(hidden, generator=generator) * 0.1
        weights["score.2.weight"] = torch.randn(1, hidden, generator=generator) * scale
        weights["score.2.bias"] = torch.randn(1, generator=generator) * 0.1
    with _config_json(out) as data:
        data["architectures"] = ["INFORMForSequenceClassification"]


GRM_NEURONS_PER_HIDDEN = 2
"""A ``grm`` demo model's value head width, in multiples of the hidden size."""


def _as_value_head_model(out: Path, config: DemoModelConfig) -> None:
    """Rewrite the causal LM in ``out`` as a GRM checkpoint (``GRewardModel``, per
    allenai/reward-bench ``rewardbench/models/grm.py``): no LM head, a value head
    ``v_head.summary.0`` (hidden → :data:`GRM_NEURONS_PER_HIDDEN`·hidden, with bias), ReLU,
    ``v_head.summary.2`` (→ 1, with bias), random (seed ``config.seed + 1``, rewards of order 1),
    and ``config.json``'s architecture ``GRewardModel`` with the value head's settings
    (``vhead_layer_type`` ``mlp``, ``vhead_num_layers`` 1, ``vhead_num_neurons``)."""
    import torch

    hidden, neurons = config.hidden, GRM_NEURONS_PER_HIDDEN * config.hidden
    with _safetensors_weights(out) as weights:
        weights.pop("lm_head.weight", None)
        generator = torch.Generator().manual_seed(config.seed + 1)
        weights["v_head.summary.0.weight"] = torch.randn(neurons, hidden, generator=generator) * (2.0 / hidden**0.5)
        weights["v_head.summary.0.bias"] = torch.randn(neurons, generator=generator) * 0.1
        weights["v_head.summary.2.weight"] = torch.randn(1, neurons, generator=generator) * (2.0 / neurons**0.5)
        weights["v_head.summary.2.bias"] = torch.randn(1, generator=generator) * 0.1
    with _config_json(out) as data:
        data.update(architectures=["GRewardModel"], vhead_layer_type="mlp", vhead_num_layers=1, vhead_num_neurons=neurons)


LDL_OBJECTIVES = 4
"""Objectives of an ``ldl`` demo model (each a score distribution of 10 bins)."""

LDL_TEMPERATURE = 0.7
"""The gate's softmax temperature of an ``ldl`` demo model."""


def _as_label_distribution_model(out: Path, config: DemoModelConfig) -> None:
    """Rewrite the causal LM in ``out`` as LDL-Reward's shape (allenai/reward-bench
    ``rewardbench/models/ldlreward.py``): the decoder alone (no LM head; ``config.json``'s
    architecture the decoder's class) and beside it ``regression_layer.pt`` (``network.0``, ``.2``:
    hidden → 2·hidden → 2·hidden, LeakyReLU after each, ``network.4`` → :data:`LDL_OBJECTIVES` × 10)
    and ``gating_layer.pt`` (``network.0``, ``.3``, ``.6``: hidden → 2·hidden → 2·hidden →
    :data:`LDL_OBJECTIVES`), random (seed ``config.seed + 1``), with ``num_objectives``,
    ``softmax`` true and ``temperature`` :data:`LDL_TEMPERATURE` in the config."""
    import torch

    with _safetensors_weights(out) as weights:
        weights.pop("lm_head.weight", None)
    generator = torch.Generator().manual_seed(config.seed + 1)
    hidden, wide = config.hidden, 2 * config.hidden

    def layers(indices: tuple[int, ...], widths: tuple[int, ...]) -> dict[str, torch.Tensor]:
        state = {}
        for index, (n_in, n_out) in zip(indices, zip(widths, widths[1:]), strict=True):
            state[f"network.{index}.weight"] = torch.randn(n_out, n_in, generator=generator) * (2.0 / n_in**0.5)
            state[f"network.{index}.bias"] = torch.randn(n_out, generator=generator) * 0.1
        return state

    torch.save(layers((0, 2, 4), (hidden, wide, wide, 10 * LDL_OBJECTIVES)), out / "regression_layer.pt")
    torch.save(layers((0, 3, 6), (hidden, wide, wide, LDL_OBJECTIVES)), out / "gating_layer.pt")
    with _config_json(out) as data:
        decoder = data["architectures"][0].replace("ForCausalLM", "Model")
        data.update(architectures=[decoder], num_objectives=10 * LDL_OBJECTIVES, softmax=True, temperature=LDL_TEMPERATURE)


def _drop_tied_lm_head(out: Path) -> None:
    """Leave ``lm_head.weight`` out of ``out``'s weights for a model whose LM head is tied to its
    embeddings (Gemma 2). ``save_pretrained`` leaves it out only when the two tensors still share
    memory at save time; a checkpoint that holds it anyway is refused by vLLM's Gemma 2 (it has
    no LM head of its own), and transformers ties the head to the embeddings on load either way."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    weights = load_file(str(path))
    if weights.pop("lm_head.weight", None) is not None:
        save_file(weights, str(path), metadata={"format": "pt"})


def _shipped_module(out: Path, name: str):
    """Copy the modeling file ``name`` of ``rmserve/demo_code/`` into ``out`` and import it from
    there (the module the checkpoint ships)."""
    import importlib.resources
    import importlib.util

    code = out / name
    code.write_bytes((importlib.resources.files("rmserve") / "demo_code" / name).read_bytes())
    spec = importlib.util.spec_from_file_location(f"rmserve_demo_{code.stem}", code)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _name_code_in_config(out: Path, code_file: str, classes: dict[str, str]) -> None:
    """Name the shipped classes in ``config.json``'s ``auto_map`` (auto class → class name in
    ``code_file``), as a checkpoint with its own code does."""
    module = code_file.removesuffix(".py")
    with _config_json(out) as data:
        data["auto_map"] = {auto: f"{module}.{cls}" for auto, cls in classes.items()}


def _inline_chat_template(out: Path, template: str) -> None:
    """Keep the chat template in ``tokenizer_config.json`` (one source), not a side file."""
    config_path = out / "tokenizer_config.json"
    data = json.loads(config_path.read_text(encoding="utf-8"))
    data["chat_template"] = template
    config_path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    side_file = out / "chat_template.jinja"
    if side_file.exists():
        side_file.unlink()
