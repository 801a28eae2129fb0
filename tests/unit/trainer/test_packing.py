"""Packed micro-batches as data: where each sequence sits in the row, which outputs predict which scored token, the
token budget's cuts; and the FLOP count behind `train/mfu`."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config

from grpo_pipe.trainer.batch import TrainSample
from grpo_pipe.trainer.packing import pack, sequence_tokens, token_budget_cuts
from grpo_pipe.trainer.throughput import ModelShape, peak_flops, throughput_metrics

CPU = torch.device("cpu")


def _sample(prompt: int, completion: int, mask: tuple[bool, ...] | None = None, start: int = 10) -> TrainSample:
    ids = tuple(range(start, start + prompt + completion))
    return TrainSample(prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                       sampling_logprobs=tuple(-0.5 - i for i in range(completion)), advantage=1.0, policy_version=0,
                       loss_mask=mask)


def test_sequences_lie_end_to_end_with_their_own_positions_and_bounds() -> None:
    samples = [_sample(3, 2), _sample(2, 4, start=50)]
    batch = pack(samples, CPU)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14, 50, 51, 52, 53, 54, 55]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]]  # restart per sequence, as the engine's
    assert batch.cu_seq_lens.tolist() == [0, 5, 11] and batch.cu_seq_lens.dtype == torch.int32
    assert batch.max_length >= 6 and batch.max_length & (batch.max_length - 1) == 0  # a power of two at least
    # the output at the token before each completion token predicts it
    assert batch.predicting.tolist() == [2, 3, 6, 7, 8, 9]
    assert batch.targets.tolist() == [13, 14, 52, 53, 54, 55]
    inputs = batch.loss_inputs
    assert inputs.completion_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert inputs.sampling_logprobs[0, :2].tolist() == [-0.5, -1.5] and inputs.sampling_logprobs[0, 2:].tolist() == [0, 0]


def test_an_episodes_environment_tokens_are_in_the_row_but_never_scored() -> None:
    mask = (True, False, False, True)  # model, tool result x 2, model
    batch = pack([_sample(2, 4, mask)], CPU)
    assert batch.input_ids.shape[1] == 6  # the environment's tokens are context
    assert batch.predicting.tolist() == [1, 4] and batch.targets.tolist() == [12, 15]
    assert batch.loss_inputs.completion_mask.tolist() == [[1, 0, 0, 1]]


def test_scatter_puts_scored_values_back_in_their_completion_rows() -> None:
    batch = pack([_sample(1, 3, (True, False, True)), _sample(2, 1)], CPU)
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out = batch.scatter(values)
    assert out.tolist() == [[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]]
    out.sum().backward()
    assert values.grad is not None and values.grad.tolist() == [1.0, 1.0, 1.0]


def test_a_width_multiple_adds_a_filler_sequence_that_nothing_scores() -> None:
    batch = pack([_sample(3, 2)], CPU, width_multiple=8)
    assert batch.input_ids.shape[1] == 8 and batch.cu_seq_lens.tolist() == [0, 5, 8]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]  # its own sequence: changes no real one
    assert batch.predicting.tolist() == [2, 3]


@pytest.mark.parametrize("budget", [1, 7, 12, 100])
def test_the_token_budget_cuts_consecutive_runs_and_never_drops_a_sample(budget: int) -> None:
    samples = [_sample(3, n) for n in (1, 2, 3, 4, 5, 9)]  # 4..12 tokens each, sorted as the plan sorts them
    cuts = token_budget_cuts(samples, budget)
    assert cuts[0].start == 0 and cuts[-1].stop == len(samples)
    assert all(a.stop == b.start and len(a) > 0 for a, b in zip(cuts, cuts[1:]))
    for cut in cuts:  # within the budget, or a sequence alone that is longer than it
        tokens = sum(sequence_tokens(samples[i]) for i in cut)
        assert tokens <= budget or len(cut) == 1
    if budget == 12:
        assert [len(c) for c in cuts] == [2, 1, 1, 1, 1]  # 4+5 | 6 (6+7 > 12) | 7 | 8 | 12
    assert token_budget_cuts([], budget) == []


def test_the_flop_count_is_six_per_weight_per_token_plus_attention_and_the_head_on_scored_tokens() -> None:
    config = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=1000)
    shape = ModelShape.from_config(config)
    # per layer: q, o 64 x 64; k, v 64 x 32 (2 heads of 16); gate, up, down 64 x 128
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert shape.body_params == 2 * per_layer and shape.attention_width == 64
    lengths, scored = [10, 30], 25
    want = 6 * 2 * per_layer * 40 + 6 * 2 * 64 * (10**2 + 30**2) + 6 * 64 * 1000 * 25
    assert shape.step_flops(lengths, scored) == pytest.approx(want)


def test_mfu_is_reported_only_where_the_peak_is_known() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989e12)
    assert peak_flops("NVIDIA H100 PCIe") == pytest.approx(756e12)
    assert peak_flops("NVIDIA H200") == pytest.approx(989e12)
    assert peak_flops("cpu") is None and peak_flops("NVIDIA GeForce GT 710") is None
    known = throughput_metrics(tokens=1000, flops=989e12, seconds=2.0, peak=989e12)
    assert known == {"train/tokens_per_s": 500.0, "train/mfu": 0.5}
    assert throughput_metrics(tokens=1000, flops=1e12, seconds=2.0, peak=None) == {"train/tokens_per_s": 500.0}
