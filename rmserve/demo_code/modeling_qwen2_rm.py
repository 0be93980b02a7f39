"""Per-token reward model of the rmserve demo (random weights), in the shape of
Qwen2.5-Math-RM-72B's ``Qwen2ForRewardModel``.

As that model card and vLLM's implementation of the architecture describe it: a Qwen2 decoder,
then a score head applied at every position — a linear layer from the hidden size to the hidden
size, a ReLU, a linear layer to ``num_labels`` (one) value — so the model gives one value per
token and the sequence's reward is the value at its last token. Written for rmserve's tests; the
checkpoint names it in ``auto_map`` (transformers has no such class), while vLLM implements the
architecture itself.
"""

from typing import Optional

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2Model, Qwen2PreTrainedModel


class Qwen2ForRewardModel(Qwen2PreTrainedModel):
    config_class = Qwen2Config

    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.score = nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, config.num_labels),
        )
        self.post_init()

    def forward(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None, **kwargs):
        """``(batch, seq, num_labels)`` values, one per position."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.score(hidden)
