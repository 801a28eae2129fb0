"""The grader's transformers engine keeps vLLM's contract: greedy tokens as the model's own, a budget per prompt, stop
strings kept up to the token that completes them, end-of-sequence kept, seeded sampling; on the tiny random model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipe.benchmarks.hf_engine import HFEngine, cut_completion
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.types import SamplingSettings

TEXTS = ["what is 3 + 4", "apples", "12 * 5 = 60. so"]
GREEDY = SamplingSettings(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(TinyRandomModel().materialize())


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    engine = HFEngine(batch_size=2, device="cpu")  # three prompts: two batches, the first one left-padded
    engine.connect(TinyRandomModel().materialize())
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


def test_greedy_completions_are_the_models_own_greedy_tokens_in_any_batch(
    engine: HFEngine, prompts: list[list[int]], tokenizer: Any
) -> None:
    model: Any = AutoModelForCausalLM.from_pretrained(TinyRandomModel().materialize(), dtype=torch.float32).eval()
    out = engine.generate(prompts, [1, 1, 1], GREEDY)
    for prompt, [completion] in zip(prompts, out):
        alone = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :]
        kept = alone.tolist()[: len(completion.token_ids)]
        assert completion.token_ids == tuple(kept)
        assert completion.text == tokenizer.decode(kept, skip_special_tokens=True)
        assert completion.logprobs == (0.0,) * len(kept) and completion.telemetry.prompt_tokens == len(prompt)
    ended = [c[0].token_ids[-1] == tokenizer.eos_token_id for c in out]
    assert [c[0].finish_reason for c in out] == ["stop" if e else "length" for e in ended]
    assert any(ended) and not all(ended)  # this tiny model ends one of them with its end-of-turn token, kept
    assert all(len(c[0].token_ids) == 12 for c, e in zip(out, ended) if not e)


def test_each_prompt_gets_its_own_budget_and_its_samples(engine: HFEngine, prompts: list[list[int]], tokenizer: Any) -> None:
    full = [c[0].token_ids for c in engine.generate(prompts, [1, 1, 1], GREEDY)]
    budgets = (3, 12, 5)
    out = engine.generate(prompts, [2, 1, 1], SamplingSettings(temperature=0.0, max_tokens=12, max_tokens_each=budgets))
    assert [len(group) for group in out] == [2, 1, 1]
    for group, tokens, budget in zip(out, full, budgets):
        kept = tokens[:budget]
        finish = "stop" if kept[-1] == tokenizer.eos_token_id else "length"
        assert [(c.token_ids, c.finish_reason) for c in group] == [(kept, finish)] * len(group)


def test_a_stop_string_keeps_the_tokens_up_to_the_one_that_completes_it(
    engine: HFEngine, prompts: list[list[int]], tokenizer: Any
) -> None:
    tokens = list(engine.generate(prompts[:1], [1], GREEDY)[0][0].token_ids)
    at, stop = _a_string_spanning_two_tokens(tokens, tokenizer)
    sampling = SamplingSettings(temperature=0.0, max_tokens=12, extra={"stop": ["never written", stop]})
    [[completion]] = engine.generate(prompts[:1], [1], sampling)
    assert completion.token_ids == tuple(tokens[: at + 1]) and completion.finish_reason == "stop"
    assert completion.text.endswith(stop) and completion.text.count(stop) == 1


def _a_string_spanning_two_tokens(tokens: list[int], tokenizer: Any) -> tuple[int, str]:
    """(k, s): s ends in the text of token k and begins in the text before it, and is not in that text."""
    for k in range(1, len(tokens)):
        before = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        after = tokenizer.decode(tokens[: k + 1], skip_special_tokens=True)
        if before and after.startswith(before) and len(after) > len(before) and "\ufffd" not in after[len(before) - 1 :]:
            stop = before[-1] + after[len(before)]
            if stop not in before:
                return k, stop
    raise AssertionError(f"no stop string to test with in {tokenizer.decode(tokens)!r}")


def test_sampling_is_seeded_and_leaves_the_callers_random_state_alone(engine: HFEngine, prompts: list[list[int]]) -> None:
    sampling = SamplingSettings(temperature=1.0, max_tokens=12, seed=7)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = engine.generate(prompts, [3, 3, 3], sampling)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's generator was not drawn from
    again = engine.generate(prompts, [3, 3, 3], sampling)
    other = engine.generate(prompts, [3, 3, 3], SamplingSettings(temperature=1.0, max_tokens=12, seed=8))
    tokens = [[c.token_ids for c in group] for group in first]
    assert tokens == [[c.token_ids for c in group] for group in again]
    assert tokens != [[c.token_ids for c in group] for group in other]
    assert len({c for group in tokens for c in group}) > 3  # samples differ from each other, not only from greedy


def test_cut_completion_ends_at_the_budget_the_end_token_or_the_token_that_completes_a_stop_string() -> None:
    pieces = {1: "<cal", 2: "c>3", 3: " * 4</c", 4: "alc>\n", 5: "tail", 9: ""}  # 9: end-of-sequence (no text)

    def decode(ids: Any) -> str:
        return "".join(pieces[i] for i in ids)

    assert cut_completion([1, 2, 3, 4, 5], 9, ["</calc>"], {9}, decode) == ([1, 2, 3, 4], "stop", "<calc>3 * 4</calc>")
    assert cut_completion([1, 2, 3, 4, 5], 3, ["</calc>"], {9}, decode) == ([1, 2, 3], "length", "<calc>3 * 4</c")
    assert cut_completion([1, 9, 9, 9], 9, [], {9}, decode) == ([1, 9], "stop", "<cal")  # what follows is padding
    assert cut_completion([1, 2, 3, 4], 9, [], {9}, decode) == ([1, 2, 3, 4], "length", "<calc>3 * 4</calc>\n")
    assert cut_completion([1, 2], 0, ["x"], {9}, decode) == ([], "length", "")
