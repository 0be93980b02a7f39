"""Model families of the demo models: the tokenizer rules and chat template of each.

The faults users meet across model families come from tokenizers and templates, not weights,
so a tiny replica of a family is the family's architecture class with random weights, a
byte-level BPE tokenizer trained locally with the family's special tokens and BOS/EOS rules,
and the family's chat template, written here from its documented format (no file of any
model is read). :func:`rmserve.demo_model.build_demo_model` builds one for
``DemoModelConfig(family=…)``.

- ``demo``: Llama; BOS ``<s>`` from the template and the tokenizer; rmserve's own role markers.
- ``llama3``: Llama; BOS ``<|begin_of_text|>`` from the template *and* the tokenizer, so a
  ``tokenizer(text)`` of the rendered text doubles it; Llama 3's headers.
- ``qwen2``: Qwen2; no BOS at all (none may be invented); ChatML with Qwen2.5's default system turn.
- ``qwen3``: Qwen3; no BOS; ChatML with the ``<think>`` block and the ``enable_thinking`` switch.
- ``gemma2``: Gemma2; BOS ``<bos>`` from the template and the tokenizer; no system role (refused),
  the assistant is ``model``.
- ``mistral``: Mistral; BOS ``<s>`` added by the tokenizer only (the template writes none);
  ``[INST] … [/INST]``.

Facts from the families' documented formats: Llama 3 (Meta's model card: ``<|begin_of_text|>``,
``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``), ChatML (Qwen2.5's default
system prompt "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."), Qwen3
(the assistant turn after the last user turn opens with a ``<think>…</think>`` block, empty
when there is no reasoning; ``enable_thinking=False`` writes the empty block into the
generation prompt), Gemma 2 (``<start_of_turn>user``/``model``, "System role not supported"),
Mistral (``[INST] … [/INST]`` with the answer and ``</s>`` after it; a system prompt goes in
front of the first user message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Family:
    """One family's tokenizer rules, chat template and architecture.

    Attributes:
        name: the ``--family`` value.
        architecture: the transformers class prefix (``Llama``, ``Qwen2``, …): the model is
            ``{architecture}ForSequenceClassification`` or ``{architecture}ForCausalLM``, its
            config ``{architecture}Config``.
        special_tokens: the special tokens, in id order from 0.
        bos, eos, pad: the tokenizer's BOS (None: the family has none), EOS and pad token.
        tokenizer_adds_bos: whether a plain ``tokenizer.encode(text)`` puts BOS in front.
        template_writes_bos: whether the chat template writes ``bos_token`` itself.
        chat_template: the Jinja chat template.
        system_role: whether the template accepts a system turn.
        config: config fields of the architecture that differ from the demo's (e.g. Gemma 2's
            soft-capping, and its LM head tied to the embeddings, as every Gemma 2 checkpoint
            and vLLM's implementation have it).
    """

    name: str
    architecture: str
    special_tokens: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str
    tokenizer_adds_bos: bool
    template_writes_bos: bool
    chat_template: str
    system_role: bool = True
    config: dict[str, Any] = field(default_factory=dict)

    def class_names(self) -> tuple[str, str, str]:
        """(config class, sequence-classifier class, causal-LM class) names in transformers."""
        return (f"{self.architecture}Config", f"{self.architecture}ForSequenceClassification",
                f"{self.architecture}ForCausalLM")


_UNKNOWN_ROLE = "{{- raise_exception('unknown role ' ~ message['role'] ~ '; expected system, user or assistant') -}}"

DEMO_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|system|>"
    "{%- elif message['role'] == 'user' -%}<|user|>"
    "{%- elif message['role'] == 'assistant' -%}<|assistant|>"
    "{%- else -%}" + _UNKNOWN_ROLE +
    "{%- endif -%}"
    "{{- '\\n' ~ message['content'] ~ eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{{- '\\n' -}}{%- endif -%}"
)
"""rmserve's demo template: BOS once, a role marker and newline per turn, EOS after each turn."""

LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}" + _UNKNOWN_ROLE + "{%- endif -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ message['content'] | trim ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
"""Llama 3's format: the template writes BOS; a header per turn; ``<|eot_id|>`` closes it."""

QWEN2_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
"""The system prompt Qwen2.5's template writes when the conversation has none."""

QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + QWEN2_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}" + _UNKNOWN_ROLE + "{%- endif -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML as Qwen2.5 writes it: no BOS, a default system turn, ``<|im_end|>\\n`` after each turn."""

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}" + _UNKNOWN_ROLE + "{%- endif -%}"
    "{%- set content = message['content'] -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' ~ reasoning ~ '\\n</think>\\n\\n' ~ content ~ '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' ~ content ~ '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ content ~ '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
"""Qwen3's ChatML: no BOS, no default system; an answer after the last user turn opens with its
``<think>`` block (empty without reasoning), earlier answers lose theirs; ``enable_thinking``
false writes the empty block into the generation prompt."""

GEMMA2_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- raise_exception('System role not supported') -}}{%- endif -%}"
    "{%- if message['role'] not in ['user', 'assistant'] -%}" + _UNKNOWN_ROLE + "{%- endif -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' ~ role ~ '\\n' ~ message['content'] | trim ~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
"""Gemma 2's format: the template writes BOS, refuses a system turn, calls the assistant ``model``."""

MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] ~ '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message['role'] not in ['user', 'assistant'] -%}" + _UNKNOWN_ROLE + "{%- endif -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '[INST] ' ~ (system if loop.first else '') ~ message['content'] ~ ' [/INST]' -}}"
    "{%- else -%}{{- message['content'] ~ eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)
"""Mistral's ``[INST]`` format: no BOS written (the tokenizer adds it), a system prompt in front
of the first user message, ``</s>`` after each answer."""

FAMILIES: dict[str, Family] = {
    "demo": Family(
        name="demo", architecture="Llama",
        special_tokens=("<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"),
        bos="<s>", eos="</s>", pad="<pad>", tokenizer_adds_bos=True, template_writes_bos=True,
        chat_template=DEMO_TEMPLATE,
    ),
    "llama3": Family(
        name="llama3", architecture="Llama",
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|finetune_right_pad_id|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
        tokenizer_adds_bos=True, template_writes_bos=True, chat_template=LLAMA3_TEMPLATE,
    ),
    "qwen2": Family(
        name="qwen2", architecture="Qwen2",
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", tokenizer_adds_bos=False, template_writes_bos=False,
        chat_template=QWEN2_TEMPLATE,
    ),
    "qwen3": Family(
        name="qwen3", architecture="Qwen3",
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", tokenizer_adds_bos=False, template_writes_bos=False,
        chat_template=QWEN3_TEMPLATE,
    ),
    "gemma2": Family(
        name="gemma2", architecture="Gemma2",
        special_tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", pad="<pad>", tokenizer_adds_bos=True, template_writes_bos=True,
        chat_template=GEMMA2_TEMPLATE, system_role=False,
        config={"hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0, "sliding_window": 4096, "tie_word_embeddings": True},
    ),
    "mistral": Family(
        name="mistral", architecture="Mistral",
        special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        bos="<s>", eos="</s>", pad="<unk>", tokenizer_adds_bos=True, template_writes_bos=False,
        chat_template=MISTRAL_TEMPLATE, config={"sliding_window": None},
    ),
}
"""The families ``rmserve demo-model --family`` builds (module docstring)."""

FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
