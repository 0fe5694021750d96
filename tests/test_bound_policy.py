"""A bound policy owns its input processing: the module's own `tokenize` is what it reads, in
training and scoring batches and when acting in a rollout; a module without one reads the
bag-of-words of the vocabulary it was built with, on any tasks it is moved to."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from helpers.data import fake_anchors
from vlaeval.config import FlowConfig
from vlaeval.envs.episodes import Episode
from vlaeval.errors import UserInputError
from vlaeval.policy.bound import bind_policy
from vlaeval.policy.tiny_vla import bag_of_words
from vlaeval.rollouts.engine import rollout_lockstep


class OwnTokenizer(nn.Module):
    """A policy with its own tokenizer (a stand-in for a VLM's): an instruction becomes its length in
    characters and its word count. It records every instruction tensor its encoder is given."""

    horizon, action_dim = 4, 4

    def __init__(self, obs_dim: int = 39) -> None:
        super().__init__()
        self.encoder = nn.Linear(obs_dim + 2, 8)
        self.head = nn.Linear(8 + 4 * 4 + 1, 4 * 4)
        self.seen: list = []

    def tokenize(self, instructions):
        return torch.tensor([[float(len(text)), float(len(text.split()))] for text in instructions])

    def encode(self, batch):
        self.seen.append(batch["instruction"].clone())
        return self.encoder(torch.cat([batch["observation"], batch["instruction"]], dim=-1))

    def velocity(self, conditioning, noisy_actions, t):
        x = torch.cat([conditioning, noisy_actions.flatten(1), t[:, None]], dim=-1)
        return self.head(x).reshape(-1, self.horizon, self.action_dim)

    def trainable_parameters(self, which):
        return list(self.head.parameters())


def test_a_policy_reads_the_tokens_its_own_tokenizer_makes_in_every_batch():
    anchors = fake_anchors()
    instructions = anchors.demonstrations.instructions
    policy = bind_policy(OwnTokenizer(obs_dim=6), instructions, FlowConfig())
    index = np.arange(len(anchors))
    batch = policy.anchor_batch(anchors, index)
    expected = torch.tensor([[float(len(instructions[k])), float(len(instructions[k].split()))] for k in range(2)])
    assert torch.equal(batch["instruction"], expected[torch.from_numpy(anchors.task_index[index])])
    # Not the bag-of-words a caller would have built (what every policy was handed before).
    assert batch["instruction"].shape[1] == 2 != bag_of_words(instructions, ["open", "close", "drawer"]).shape[1]


def test_a_rollout_hands_the_policy_its_own_tokens_of_each_episodes_task():
    torch.manual_seed(0)
    model = OwnTokenizer()
    instructions = ["reach the goal", "push the puck to the goal"]
    policy = bind_policy(model, instructions, FlowConfig(sampling_steps=2))
    episodes = [Episode("reach-v3", 0, 25, 11), Episode("push-v3", 1, 25, 12)]
    rollout_lockstep(policy, episodes, execute_actions=4, max_steps=4)
    first = model.seen[0]  # the first control step: both episodes, padded to the minimum batch
    assert torch.equal(first[0], torch.tensor([14.0, 3.0])) and torch.equal(first[1], torch.tensor([25.0, 6.0]))


def test_a_module_without_a_tokenizer_reads_the_vocabulary_it_was_bound_with_on_any_tasks():
    class Plain(nn.Linear):
        pass

    vocab = ["close", "drawer", "open", "the"]
    policy = bind_policy(Plain(1, 1), ["open the drawer", "close the drawer"], FlowConfig(), vocab=vocab)
    assert torch.equal(policy.tokens, bag_of_words(["open the drawer", "close the drawer"], vocab))
    # Held-out tasks with a word the policy never saw: the same width, the unseen word ignored.
    moved = policy.for_instructions(["open the window"])
    assert moved.tokens.shape == (1, 4) and torch.equal(moved.tokens, bag_of_words(["open the window"], vocab))
    # The negative control: tokenizing the new tasks by their own vocabulary changes the width.
    assert bind_policy(Plain(1, 1), ["open the window"], FlowConfig()).tokens.shape[1] != 4


def test_a_tokenizer_that_returns_the_wrong_rows_is_refused_in_one_line():
    class Wrong(OwnTokenizer):
        def tokenize(self, instructions):
            return torch.zeros(1, 2)

    with pytest.raises(UserInputError) as error:
        bind_policy(Wrong(), ["a", "b", "c"], FlowConfig())
    message = str(error.value)
    assert "\n" not in message and "Wrong.tokenize returned Tensor (1, 2) for 3 instructions" in message


def test_a_bound_policy_pickles_whole_for_worker_processes():
    torch.manual_seed(0)
    policy = bind_policy(OwnTokenizer(), ["reach the goal"], FlowConfig(sampling_steps=3))
    again = pickle.loads(pickle.dumps(policy))
    assert torch.equal(again.tokens, policy.tokens) and again.flow == policy.flow and again.sampling_steps == 3
    for a, b in zip(again.model.parameters(), policy.model.parameters()):
        assert torch.equal(a, b)
