"""Configuration of the rmserve demo's InternLM2 reward model (random weights).

The fields InternLM2's reward models (``InternLM2ForRewardModel``, e.g. internlm2-7b-reward)
carry in their ``config.json``, as vLLM's implementation of the architecture reads them, plus
``reward_token_id``: the token appended to a conversation, at which the reward is read. Written
for rmserve's tests; the checkpoint names it in ``auto_map`` (``AutoConfig``), since
transformers has no InternLM2 configuration of its own.
"""

from transformers import PretrainedConfig


class InternLM2Config(PretrainedConfig):
    model_type = "internlm2"

    def __init__(self, vocab_size=2000, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=4096,
                 rms_norm_eps=1e-6, rope_theta=10000.0, bias=False, reward_token_id=None, tie_word_embeddings=False,
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        self.bias = bias
        self.reward_token_id = reward_token_id
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
