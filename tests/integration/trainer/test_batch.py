"""Training tensors on a real tiny transformers model: a padded micro-batch gives each completion the
log-probs it has alone, unpadded, whichever way the logits are projected and the log-softmax chunked."""

import pytest
import torch

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer import batch as batch_module
from grpo_pipe.trainer.batch import TrainSample, collate, completion_logprobs
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.scoring import takes_logits_to_keep

TEMPERATURE = 0.7


def _samples() -> list[TrainSample]:
    """Prompts and completions of different lengths, so rows differ in left and right padding."""
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, 400, (n,), generator=gen).tolist())

    shapes = [(3, 5), (7, 2), (5, 6), (1, 1)]
    return [TrainSample(prompt_ids=ids(p), completion_ids=ids(c), sampling_logprobs=tuple([-1.0] * c), advantage=1.0,
                        policy_version=0) for p, c in shapes]


def _alone(model: torch.nn.Module, sample: TrainSample) -> torch.Tensor:
    """The completion's log-probs from an unpadded forward over the whole sequence. [T]"""
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / TEMPERATURE  # [L, V]
    start = len(sample.prompt_ids)
    picked = torch.log_softmax(logits[start - 1 : -1], dim=-1)  # [T, V]
    return picked.gather(-1, torch.tensor(sample.completion_ids).unsqueeze(-1)).squeeze(-1)


def _model(policy_cls: type) -> torch.nn.Module:
    torch.manual_seed(0)
    policy = policy_cls() if policy_cls is FullFinetunePolicy else LoraPolicy(rank=4)
    policy.load(TinyRandomModel().materialize(), torch.device("cpu"), torch.float32)
    assert policy.module is not None
    return policy.module


@pytest.mark.parametrize("policy_cls", [FullFinetunePolicy, LoraPolicy])
@pytest.mark.parametrize("logits_to_keep", [True, False])
def test_padded_micro_batch_matches_each_sample_alone(policy_cls: type, logits_to_keep: bool) -> None:
    model = _model(policy_cls)
    assert takes_logits_to_keep(model)  # Hugging Face causal LMs do, through a peft wrapper too
    samples = _samples()
    batch = collate(samples, pad_id=0, device=torch.device("cpu"))
    with torch.no_grad():
        logits = model(**batch.model_inputs(logits_to_keep)).logits
    width = batch.loss_inputs.width
    assert logits.shape[1] == (width + 1 if logits_to_keep else batch.input_ids.shape[1])
    got = completion_logprobs(logits, batch, TEMPERATURE)  # [B, T]
    for row, sample in enumerate(samples):
        n = len(sample.completion_ids)
        torch.testing.assert_close(got[row, :n], _alone(model, sample), rtol=0, atol=2e-5)
        assert torch.all(got[row, n:] == 0)  # padding carries no log-prob


def test_chunked_log_softmax_gives_the_same_values_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(FullFinetunePolicy)
    batch = collate(_samples(), pad_id=0, device=torch.device("cpu"))

    def values_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logits = model(**batch.model_inputs(True)).logits
        logprobs = completion_logprobs(logits, batch, TEMPERATURE)
        logprobs.sum().backward()
        return logprobs.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole, whole_grads = values_and_grads()
    vocab = model.config.vocab_size
    monkeypatch.setattr(batch_module, "LOGSOFTMAX_CHUNK_ELEMENTS", batch.loss_inputs.width * vocab)  # a row each
    chunked, chunked_grads = values_and_grads()
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
    assert len(chunked_grads) == len(whole_grads) > 0
    for a, b in zip(chunked_grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_model_without_logits_to_keep_is_recognised() -> None:
    class NoKeep(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
            return input_ids

    assert not takes_logits_to_keep(NoKeep())
