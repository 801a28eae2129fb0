"""The endpoint's routes against an in-memory engine (FastAPI's test client): the token, the shapes OpenAI's clients,
vLLM's `/generate` and atroposlib read, the engine's own tokens and policy version in every answer, and every refusal.
The real engine over real HTTP: tests/integration/serving/test_endpoint.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from grpo_pipe.serving.batcher import RequestBatcher
from grpo_pipe.serving.endpoint import EngineEndpoint
from grpo_pipe.serving.openai_api import ServedModel, build_app
from grpo_pipe.serving.served_log import ServedLog
from tests.fakes import GatedEngine

TOKEN = "secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CharTokenizer:
    """One character, one token (ids = code points); a plain chat template."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: Any = None) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")


@pytest.fixture
def client() -> Iterator[TestClient]:
    engine = GatedEngine()
    engine.gate.set()
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    model = ServedModel(name="tiny", tokenizer=CharTokenizer(), max_model_len=64, vocab_size=300)
    try:
        yield TestClient(build_app(batcher, model, TOKEN))
    finally:
        batcher.close()


@pytest.mark.parametrize(("method", "path"), [("get", "/health"), ("get", "/v1/models"), ("post", "/v1/completions"),
                                              ("post", "/v1/chat/completions"), ("post", "/generate"),
                                              ("post", "/inference/v1/generate")])
def test_every_route_wants_the_token(client: TestClient, method: str, path: str) -> None:
    body = {"json": {"prompt": "ab", "messages": []}} if method == "post" else {}
    assert getattr(client, method)(path, **body).status_code == 401
    assert getattr(client, method)(path, headers={"Authorization": "Bearer wrong"}, **body).status_code == 401


def test_completions_carry_the_engines_tokens_logprobs_and_policy_version(client: TestClient) -> None:
    answer = client.post("/v1/completions", headers=AUTH,
                         json={"model": "tiny", "prompt": [[97, 98, 99], "xy"], "n": 2, "max_tokens": 2, "logprobs": 1})
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in choices] == [[99, 98], [99, 98], [121, 120], [121, 120]]  # the engine's, as sampled
    assert [c["prompt_token_ids"] for c in choices[1:3]] == [[97, 98, 99], [120, 121]]
    assert choices[0]["logprobs"]["tokens"] == ["c", "b"] and choices[0]["logprobs"]["token_logprobs"] == [-0.5, -0.5]
    assert choices[0]["logprobs"]["text_offset"] == [0, 1]
    assert all(c["policy_version"] == 3 and c["version_switches"] == [] for c in choices)
    assert answer.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}


def test_chat_completions_render_the_template_and_return_its_tokens(client: TestClient) -> None:
    answer = client.post("/v1/chat/completions", headers=AUTH,
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["prompt_token_ids"] == [ord(c) for c in "<user>hi<assistant>"]
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["token_ids"] == [ord(">"), ord("t"), ord("n")]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [">", "t", "n"]


def test_generate_answers_in_the_shape_atroposlib_reads(client: TestClient) -> None:
    answer = client.post("/generate", headers=AUTH,
                         json={"prompt": {"prompt_token_ids": [5, 6, 7]}, "logprobs": 0, "n": 2, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    results = answer.json()
    # atroposlib's VLLMServer: ids and log-probs from [{id: logprob}] per token, one list per sample
    ids = [[int(next(iter(item[0]))) for item in sample] for sample in results["logprobs"]]
    logprobs = [[next(iter(item[0].values())) for item in sample] for sample in results["logprobs"]]
    assert ids == [[7, 6], [7, 6]] and logprobs == [[-0.5, -0.5]] * 2
    assert results["finish_reasons"] == ["stop", "stop"] and results["policy_versions"] == [3, 3]


def test_token_generate_answers_in_the_shape_the_verifiers_train_client_reads(client: TestClient) -> None:
    answer = client.post("/inference/v1/generate", headers={**AUTH, "X-Session-ID": "s1"},
                         json={"model": "tiny", "token_ids": [5, 6, 7],
                               "sampling_params": {"temperature": 0.7, "max_tokens": 2, "stop_token_ids": [9],
                                                   "logprobs": 1, "skip_special_tokens": False}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["prompt_token_ids"] == [5, 6, 7] and body["request_id"]
    (choice,) = body["choices"]
    assert choice["token_ids"] == [7, 6] and choice["finish_reason"] == "stop" and choice["policy_version"] == 3
    assert choice["logprobs"]["content"] == [{"token": "token_id:7", "logprob": -0.5},
                                             {"token": "token_id:6", "logprob": -0.5}]


def test_token_generate_samples_as_asked_and_is_recorded_as_served() -> None:
    """What the route served is in the endpoint's ServedLog, at the temperature asked, as every other route's."""
    engine = GatedEngine()
    engine.gate.set()
    served = ServedLog()
    batcher = RequestBatcher(engine=engine, served=served)  # type: ignore[arg-type]
    try:
        client = TestClient(build_app(batcher, ServedModel(name="tiny", tokenizer=CharTokenizer(), max_model_len=64,
                                                           vocab_size=300), TOKEN))
        answer = client.post("/inference/v1/generate", headers=AUTH,
                             json={"token_ids": [5, 6, 7], "sampling_params": {"temperature": 0.7, "max_tokens": 2,
                                                                                "stop_token_ids": [9]}})
        assert answer.status_code == 200, answer.text
    finally:
        batcher.close()
    (prompts, sampling), = engine.calls
    assert prompts == [(5, 6, 7)] and sampling.temperature == 0.7 and sampling.extra["stop_token_ids"] == [9]
    record = served.find([5, 6, 7], [7, 6])
    assert record is not None and record.logprobs == (-0.5, -0.5) and record.temperature == 0.7


@pytest.mark.parametrize(("body", "says"), [
    ({"prompt": [1, 2, 999]}, "outside the vocabulary"),
    ({"prompt": "x" * 60, "max_tokens": 10}, "more than the model's 64"),
    ({"prompt": "ab", "stream": True}, "streaming is not served"),
    ({"prompt": []}, "empty"),
])
def test_a_bad_request_is_refused_with_what_is_wrong(client: TestClient, body: dict[str, Any], says: str) -> None:
    answer = client.post("/v1/completions", headers=AUTH, json=body)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"]


def test_a_request_outside_the_schema_is_refused(client: TestClient) -> None:
    assert client.post("/v1/completions", headers=AUTH, json={"prompt": "ab", "n": 0}).status_code == 422
    assert client.post("/v1/completions", headers=AUTH, json={"prompt": "ab", "temperature": -1}).status_code == 422


def test_the_endpoint_refuses_a_host_other_machines_reach_unless_allowed() -> None:
    model = ServedModel(name="tiny", tokenizer=CharTokenizer(), max_model_len=64, vocab_size=300)
    with pytest.raises(ValueError, match="not a loopback address"):
        EngineEndpoint(engine=GatedEngine(), model=model, host="0.0.0.0")  # type: ignore[arg-type]
    assert EngineEndpoint(engine=GatedEngine(), model=model, host="0.0.0.0", allow_remote=True).host == "0.0.0.0"  # type: ignore[arg-type]
    assert len(EngineEndpoint(engine=GatedEngine(), model=model).token) >= 32  # type: ignore[arg-type]


def test_a_request_the_engine_does_not_answer_in_time_gets_504_with_the_reason() -> None:
    engine = GatedEngine()  # its gate stays shut: the engine never answers
    batcher = RequestBatcher(engine=engine)  # type: ignore[arg-type]
    model = ServedModel(name="tiny", tokenizer=CharTokenizer(), max_model_len=64, vocab_size=300)
    client = TestClient(build_app(batcher, model, TOKEN, timeout_s=0.2))
    try:
        answer = client.post("/v1/completions", headers=AUTH, json={"prompt": "ab", "max_tokens": 4})
        late = client.post("/v1/completions", headers=AUTH, json={"prompt": "cd", "max_tokens": 4})  # queued, gives up
        assert answer.status_code == late.status_code == 504
        assert "did not answer within" in answer.json()["error"]["message"]
        engine.gate.set()  # the engine answers the first at last; the abandoned request is not sent
        served = TestClient(build_app(batcher, model, TOKEN, timeout_s=30)).post(
            "/v1/completions", headers=AUTH, json={"prompt": "ef", "max_tokens": 4})
        assert served.status_code == 200  # the batcher lived through the abandoned requests
    finally:
        engine.gate.set()
        batcher.close()
    assert [prompts for prompts, _ in engine.calls] == [[(97, 98)], [(101, 102)]]
