"""The InternLM2 reward model (``InternLM2ForRewardModel``, the ``reward-token`` head) computed
from its description, to check the served rewards against: the checkpoint's InternLM2 tensors
unpacked into transformers' own ``LlamaModel`` (InternLM2's decoder is Llama's under other names;
``wqkv`` holds, per key/value head, its group's query rows, then its key rows, then its value
rows), run on the sequence with ``reward_token_id`` appended, and ``v_head`` applied at that last
position. Shares no code with rmserve or the demo builder. One unpadded pass per sequence, float32.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def internlm2_reward_forward(folder: Path, sequences: Sequence[Sequence[int]], *, append: bool = True) -> list[float]:
    """Per sequence, ``v_head · h`` at the appended reward token (``append=False``: at the
    sequence's own last token, what a scorer that forgets the token computes)."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaModel

    config = json.loads((Path(folder) / "config.json").read_text())
    weights = load_file(str(Path(folder) / "model.safetensors"))
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, group = hidden // heads, heads // kv_heads
    llama = LlamaConfig(vocab_size=config["vocab_size"], hidden_size=hidden, intermediate_size=config["intermediate_size"],
                        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
                        num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=config["rms_norm_eps"],
                        max_position_embeddings=config["max_position_embeddings"], rope_theta=config["rope_theta"])
    state = {"embed_tokens.weight": weights["model.tok_embeddings.weight"], "norm.weight": weights["model.norm.weight"]}
    for i in range(config["num_hidden_layers"]):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        wqkv = weights[src + "attention.wqkv.weight"].view(kv_heads, group + 2, head_dim, hidden)
        state[dst + "self_attn.q_proj.weight"] = wqkv[:, :group].reshape(heads * head_dim, hidden)
        state[dst + "self_attn.k_proj.weight"] = wqkv[:, group].reshape(kv_heads * head_dim, hidden)
        state[dst + "self_attn.v_proj.weight"] = wqkv[:, group + 1].reshape(kv_heads * head_dim, hidden)
        state[dst + "self_attn.o_proj.weight"] = weights[src + "attention.wo.weight"]
        state[dst + "mlp.gate_proj.weight"] = weights[src + "feed_forward.w1.weight"]
        state[dst + "mlp.up_proj.weight"] = weights[src + "feed_forward.w3.weight"]
        state[dst + "mlp.down_proj.weight"] = weights[src + "feed_forward.w2.weight"]
        state[dst + "input_layernorm.weight"] = weights[src + "attention_norm.weight"]
        state[dst + "post_attention_layernorm.weight"] = weights[src + "ffn_norm.weight"]
    model = LlamaModel(llama).to(torch.float32).eval()
    model.load_state_dict(state, strict=True)
    v_head = weights["v_head.weight"].double()
    token = config["reward_token_id"]
    rewards = []
    with torch.inference_mode():
        for ids in sequences:
            ids = [*ids, token] if append else list(ids)
            h = model(torch.tensor([ids])).last_hidden_state[0, -1].double()
            rewards.append(float((v_head @ h)[0]))
    return rewards
