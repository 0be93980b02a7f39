"""Gated multi-objective reward model of the rmserve demo (random weights).

The head follows what ArmoRM-Llama3-8B-v0.1's model card describes: a Llama decoder, a linear
regression layer giving one reward per objective at the last token, and a gating layer whose
softmax weighs the objectives; the reward (``score``) is the gated sum. Written for rmserve's
tests: it is loaded through ``auto_map`` with ``trust_remote_code=True``, so the remote-code
path of transformers runs it.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel, LlamaPreTrainedModel
from transformers.utils import ModelOutput


class GatedRewardConfig(LlamaConfig):
    model_type = "rmserve_gated_rm"

    def __init__(self, num_objectives=4, **kwargs):
        self.num_objectives = num_objectives
        super().__init__(**kwargs)


@dataclass
class GatedRewardOutput(ModelOutput):
    score: Optional[torch.FloatTensor] = None
    rewards: Optional[torch.FloatTensor] = None
    gating_output: Optional[torch.FloatTensor] = None


class GatedRewardModel(LlamaPreTrainedModel):
    config_class = GatedRewardConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.regression_layer = nn.Linear(config.hidden_size, config.num_objectives, bias=False)
        self.gating = nn.Linear(config.hidden_size, config.num_objectives, bias=True)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(dim=-1) - 1
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        rewards = self.regression_layer(pooled)
        gate = torch.softmax(self.gating(pooled), dim=-1)
        score = (gate * rewards).sum(dim=-1, keepdim=True)
        return GatedRewardOutput(score=score, rewards=rewards, gating_output=gate)
