"""How a micro-batch is laid out: every query attends to some key (a query that attends to none gave NaN gradients
on a GPU), the repeats that fill a short prompt are invisible to real tokens and carry its last token and position,
and every completion starts at the same column."""

from __future__ import annotations

import torch

from grpo_pipe.trainer.batch import TrainSample, collate

PAD = 0


def _sample(prompt: tuple[int, ...], completion: tuple[int, ...]) -> TrainSample:
    return TrainSample(prompt_ids=prompt, completion_ids=completion, sampling_logprobs=tuple([-1.0] * len(completion)),
                       advantage=1.0, policy_version=0)


SAMPLES = [_sample((11, 12, 13, 14, 15), (21, 22)), _sample((31,), (41, 42, 43)), _sample((51, 52), (61,))]


def _visible(attention: torch.Tensor) -> torch.Tensor:
    """[B, L, L] which keys each query attends to: causal, and only unmasked keys (as the model builds it)."""
    length = attention.shape[1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    return causal[None] & attention.bool()[:, None, :]


def test_every_query_attends_to_at_least_one_key_whatever_the_prompt_lengths() -> None:
    for width_multiple in (1, 8):
        batch = collate(SAMPLES, PAD, torch.device("cpu"), width_multiple)
        assert _visible(batch.attention_mask).any(dim=-1).all(), width_multiple


def test_a_short_prompt_is_filled_with_its_last_token_masked_out_at_its_last_position() -> None:
    batch = collate(SAMPLES, PAD, torch.device("cpu"))
    assert batch.input_ids.tolist() == [
        [11, 12, 13, 14, 15, 21, 22, PAD],
        [31, 31, 31, 31, 31, 41, 42, 43],
        [51, 52, 52, 52, 52, 61, PAD, PAD],
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 0, 0, 0, 1, 0, 0],
    ]
    # the column before the completions (4) has each prompt's last position; the completion counts on from it
    assert batch.position_ids[:, 4].tolist() == [4, 0, 1]
    assert batch.position_ids[:, 5].tolist() == [5, 1, 2]


def test_a_repeat_sees_exactly_the_keys_of_the_prompt_token_it_repeats() -> None:
    """So it computes what that token does (same token, same position, same keys), and no real token sees it."""
    batch = collate(SAMPLES, PAD, torch.device("cpu"))
    visible = _visible(batch.attention_mask)
    for row, sample in enumerate(SAMPLES):
        last = len(sample.prompt_ids) - 1
        for column in range(last + 1, 5):
            assert torch.equal(visible[row, column], visible[row, last]), (row, column)
            assert not visible[row, :, column].any(), (row, column)  # masked as a key: seen by no query


def test_completions_start_at_one_column_and_their_masks_follow_them() -> None:
    batch = collate(SAMPLES, PAD, torch.device("cpu"), width_multiple=8)
    assert batch.input_ids.shape[1] % 8 == 0
    assert batch.completion_ids[:, :3].tolist() == [[21, 22, PAD], [41, 42, 43], [61, PAD, PAD]]
    assert batch.loss_inputs.completion_mask[:, :3].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert batch.loss_inputs.completion_mask[:, 3:].sum() == 0
