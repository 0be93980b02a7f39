"""An independent DPO implicit-reward computation on TEXT, to check the served one against.

Written from the official algorithm (allenai/reward-bench ``rewardbench/utils.py``
``prepare_dialogue_from_tokenizer``, ``rewardbench/dpo.py`` ``DPOInference.tokenize_row``,
``build_tokenized_answer`` and ``get_batch_logps``; RM-Bench's harness pairs chosen ``i`` with
rejected ``i``), sharing no code with ``rmserve.server``: its own chat-template calls, its own
tokenizer calls, one transformers forward pass per sequence (no batch, no padding), float32
log-softmax.

``compat="official"`` follows the official script exactly (a BOS always prepended, the answer
text by ``str.replace``, the pairwise ``keep_end`` truncation to 2048 / 128 tokens);
``compat="none"`` is the corrected computation rmserve serves by default (the tokenizer's BOS
prepended only when it has one and the text does not start with it, never an EOS in its place;
the answer text as the suffix after the prompt text, no truncation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


MAX_LENGTH = 2048
MAX_PROMPT_LENGTH = 128


@dataclass(frozen=True)
class ReferenceScore:
    """One response's reference numbers: the token ids used and the rewards of every mode."""

    input_ids: list[int]
    prompt_len: int
    policy_logps: list[float]
    reference_logps: list[float] | None
    rewards: dict[str, float]


def _tokenize_response(tokenizer: Any, prompt_text: str, full_text: str, compat: str) -> tuple[list[int], list[int]]:
    """(prompt ids with BOS, answer ids with EOS) of one response, before any truncation."""
    if compat == "official":
        answer_text = full_text.replace(prompt_text, "")
    else:
        assert full_text.startswith(prompt_text), "the template must render prompt + answer"
        answer_text = full_text[len(prompt_text) :]
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(prompt_text + answer_text, add_special_tokens=False)["input_ids"]
    boundary = len(prompt_ids)
    if full_ids[:boundary] != prompt_ids:  # a token merged across the boundary
        boundary -= 1
    prompt_part = list(full_ids[:boundary])
    answer_part = list(full_ids[boundary:]) + [tokenizer.eos_token_id]
    if compat == "official":  # run_dpo.py: EOS stands in for a missing BOS
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        prompt_part = [bos] + prompt_part
    elif tokenizer.bos_token_id is not None and prompt_part[:1] != [tokenizer.bos_token_id]:
        prompt_part = [tokenizer.bos_token_id] + prompt_part
    assert prompt_part, "nothing before the answer"
    return prompt_part, answer_part


def _answer_logps(model: Any, ids: list[int], prompt_len: int) -> list[float]:
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1)
    return [float(logps[i - 1, ids[i]]) for i in range(prompt_len, len(ids))]


def reference_group_scores(
    policy: Any, reference: Any | None, tokenizer: Any, messages: list[dict[str, str]], responses: list[str],
    *, compat: str = "none",
) -> list[ReferenceScore]:
    """The implicit rewards of every response of a group under ``policy`` (and ``reference``).

    Args:
        policy / reference: transformers causal LMs (``reference`` None: reference-free only).
        tokenizer: the shared tokenizer (with its chat template).
        messages: the conversation, ending with a user turn.
        responses: the candidate answers; in ``official`` mode an even group pairs ``j`` with
            ``j + n/2`` for the truncation, an odd one pairs nothing.

    Returns:
        Per response: ids, prompt length, per-token log-probs and ``rewards`` with keys
        ``avg``, ``sum``, ``norm`` and (with a reference) ``reference``.
    """
    prompt_text = tokenizer.apply_chat_template(messages, tokenize=False)
    parts = []
    for response in responses:
        full_text = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
        parts.append(_tokenize_response(tokenizer, prompt_text, full_text, compat))
    if compat == "official":
        n = len(parts)
        answer_lens = [len(a) for _, a in parts]
        truncated = []
        for j, (prompt_part, answer_part) in enumerate(parts):
            longer = max(answer_lens[j], answer_lens[(j + n // 2) % n]) if n % 2 == 0 else answer_lens[j]
            if len(prompt_part) + longer > MAX_LENGTH:
                prompt_part = prompt_part[-MAX_PROMPT_LENGTH:]
            if len(prompt_part) + longer > MAX_LENGTH:
                answer_part = answer_part[: MAX_LENGTH - MAX_PROMPT_LENGTH]
            truncated.append((prompt_part, answer_part))
        parts = truncated
    import torch

    scores = []
    for prompt_part, answer_part in parts:
        ids = prompt_part + answer_part
        policy_logps = _answer_logps(policy, ids, len(prompt_part))
        ref_logps = None if reference is None else _answer_logps(reference, ids, len(prompt_part))
        total = sum(policy_logps)
        rewards = {
            "avg": total / len(policy_logps),
            "sum": total,
            "norm": -float(torch.linalg.vector_norm(torch.tensor(policy_logps, dtype=torch.float64))),
        }
        if ref_logps is not None:
            rewards["reference"] = total - sum(ref_logps)
        scores.append(ReferenceScore(ids, len(prompt_part), policy_logps, ref_logps, rewards))
    return scores
