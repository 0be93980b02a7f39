"""How the remote-code head reads a model's own output (:func:`model_output_rewards`), on small
torch modules written here whose outputs are known by construction: a gated model's ``score``
and ``rewards`` (ArmoRM's output fields), a value head's one logit (INF-ORM / GRM style, an MLP
over the last hidden state), a tuple output; and the errors for outputs it cannot read.

Each module's output is a function of the input ids and mask written out below, so the
expected rewards are computed here by hand, not by the code under test.
"""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.model
torch = model_output_rewards = None  # set by the fixture below: the fast lane collects this file without torch


@pytest.fixture(autouse=True)
def _torch():
    global torch, model_output_rewards
    import torch as imported

    from rmserve.server.engines.hf_engine import model_output_rewards as reader

    torch, model_output_rewards = imported, reader

PAD = 0


class Recorder:
    """A model returning, per sequence, value = (sum of its real ids) and last = (its last real
    id), read from the mask; records the padded batch it was given."""

    def __init__(self, make_output):
        self.make_output = make_output
        self.calls = []

    def __call__(self, input_ids, attention_mask):
        self.calls.append((input_ids.tolist(), attention_mask.tolist()))
        total = (input_ids * attention_mask).sum(-1).float()
        last = input_ids[torch.arange(input_ids.shape[0]), attention_mask.sum(-1) - 1].float()
        return self.make_output(total, last)


SEQUENCES = [[5, 6, 7], [9], [2, 3]]
TOTALS = [18.0, 9.0, 5.0]
LASTS = [7.0, 9.0, 3.0]


def test_a_gated_output_gives_its_score_and_keeps_the_objectives():
    model = Recorder(lambda total, last: types.SimpleNamespace(
        score=(total / 2)[:, None], rewards=torch.stack([total, last], dim=-1), gating_output=None))
    out = model_output_rewards(model, SEQUENCES, pad_id=PAD, device=torch.device("cpu"))
    assert out == [(9.0, {"objective_0": 18.0, "objective_1": 7.0}), (4.5, {"objective_0": 9.0, "objective_1": 9.0}),
                   (2.5, {"objective_0": 5.0, "objective_1": 3.0})]
    # right-padded with the pad id, with the mask the model's own code reads the end from
    assert model.calls == [([[5, 6, 7], [9, 0, 0], [2, 3, 0]], [[1, 1, 1], [1, 0, 0], [1, 1, 0]])]


def test_a_value_head_gives_its_one_logit_and_no_extras():
    model = Recorder(lambda total, last: types.SimpleNamespace(logits=(last - 1)[:, None]))
    assert model_output_rewards(model, SEQUENCES, pad_id=PAD, device=torch.device("cpu")) == [
        (6.0, {}), (8.0, {}), (2.0, {})]


def test_a_tuple_output_is_read_from_its_first_element():
    model = Recorder(lambda total, last: (total, last))
    assert [r for r, _ in model_output_rewards(model, SEQUENCES, pad_id=PAD, device=torch.device("cpu"))] == TOTALS


@pytest.mark.parametrize(
    ("make_output", "message"),
    [
        (lambda total, last: types.SimpleNamespace(logits=torch.stack([total, last], dim=-1)),
         "the model's logits has shape (3, 2) for 3 sequences; the remote-code head reads one value per sequence"),
        (lambda total, last: types.SimpleNamespace(hidden_states=total),
         "the model's output (SimpleNamespace) has no score or logits tensor to read the reward from"),
    ],
)
def test_an_output_it_cannot_read_is_an_error_naming_it(make_output, message):
    with pytest.raises(ValueError) as info:
        model_output_rewards(Recorder(make_output), SEQUENCES, pad_id=PAD, device=torch.device("cpu"))
    assert str(info.value) == message
