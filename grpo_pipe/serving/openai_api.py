"""The engine behind the HTTP routes that environment processes call: OpenAI's completions and chat completions,
vLLM's own `/generate` (what `atroposlib`'s `vllm` server type calls for token ids and log-probs), and the token-in,
token-out `/inference/v1/generate` (what `verifiers`' train client calls: it renders the chat itself and sends ids).

Every answer carries the tokens exactly as the engine sampled them (`token_ids`, and `prompt_token_ids` as vLLM's
`return_token_ids` gives them), their log-probs, and the policy version that sampled them (`policy_version`, with
`version_switches` where a sync landed mid-sample), so a trainer never has to re-tokenise text that came back over
HTTP. Log-probs are the sampled token's only: a request for top alternatives gets that one entry (the engine computes
no others). Every route wants `Authorization: Bearer <token>`.

A test holds the n-th generation request of the process at `environment_request@n` (`runtime.halt`): received, not yet
handed to the engine; the one request waits on a thread of its own while the others are served.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from grpo_pipe.runtime.env import halt_request
from grpo_pipe.runtime.halt import halt_point
from grpo_pipe.serving.batcher import EndpointClosed, RequestBatcher, SamplingKey
from grpo_pipe.serving.batcher import Request as EngineRequest
from grpo_pipe.types import Completion

MAX_SAMPLES = 256  # n per request: an environment's group, with room to spare


class SamplingFields(BaseModel):
    """What every generation request may set (other fields, e.g. `model` or `user`, are accepted and ignored).

    Args:
        n: Samples of the prompt.
        max_tokens: The token budget of each sample; None: the model's default.
        max_completion_tokens: The chat API's newer name for `max_tokens`; it wins where both are given.
        temperature: The sampling temperature.
        top_p: Nucleus sampling's probability mass.
        stop: A string, or several, that ends a sample.
        stop_token_ids: Token ids that end a sample.
        seed: The sampling seed; None: unseeded.
        stream: Must be false: streaming is not served.
    """

    model_config = ConfigDict(extra="allow")

    n: int = Field(1, ge=1, le=MAX_SAMPLES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False


class CompletionRequest(SamplingFields):
    """`/v1/completions`: one prompt or several, and the sampling fields (`SamplingFields`, documented there).

    Args:
        prompt: One prompt, or several, each text or token ids.
        logprobs: Return each sampled token's log-prob when given (a number, as OpenAI's API takes); None: not.
    """

    prompt: str | list[int] | list[str | list[int]]
    logprobs: int | None = None


class ChatRequest(SamplingFields):
    """`/v1/chat/completions`: chat messages rendered with the model's chat template, and the sampling fields
    (`SamplingFields`, documented there).

    Args:
        messages: The conversation so far, as `{"role", "content"}` messages.
        logprobs: Return each sampled token's log-prob.
        top_logprobs: Accepted, not served: every token's `top_logprobs` is empty.
        tools: The tools' JSON schemas, handed to the chat template; None: none.
    """

    messages: list[dict[str, Any]]
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(SamplingFields):
    """vLLM's `/generate`: `{"prompt": {"prompt_token_ids": [...]}}` or a text prompt, and the sampling fields
    (`SamplingFields`, documented there).

    Args:
        prompt: A text prompt, or `{"prompt_token_ids": [...]}`.
        logprobs: Accepted for vLLM's API; the log-probs are always returned.
    """

    prompt: str | dict[str, list[int]]
    logprobs: int | None = None


class TokensRequest(BaseModel):
    """`/inference/v1/generate` (verifiers' train client): prompt token ids, and vLLM's sampling parameters.

    Args:
        token_ids: The prompt's token ids.
        sampling_params: The sampling fields; none given: their defaults.
    """

    model_config = ConfigDict(extra="allow")

    token_ids: list[int]
    sampling_params: SamplingFields = Field(default_factory=lambda: SamplingFields.model_validate({}))


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """What the routes need besides the engine: the model's name and tokenizer, and the engine's limits.

    Args:
        name: The name the model is served under (`/v1/models`).
        tokenizer: The model's tokenizer: encodes text prompts, renders chats, decodes samples.
        max_model_len: The engine's limit on prompt plus completion tokens.
        vocab_size: Token ids of a prompt must lie in [0, vocab_size).
        default_max_tokens: The token budget of a request that sets none.
    """

    name: str
    tokenizer: Any
    max_model_len: int
    vocab_size: int
    default_max_tokens: int = 256


class BadRequest(Exception):
    """A request the endpoint refuses (HTTP 400), with what was wrong."""


def build_app(batcher: RequestBatcher, model: ServedModel, token: str, timeout_s: float = 600.0) -> FastAPI:
    """The FastAPI app; `token` is the bearer token every route wants."""
    app = FastAPI(title="grpo_pipe engine endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    auth = _bearer(token)
    numbers = itertools.count(1)  # the generation requests served, numbered for the held point

    async def sample(ids: tuple[int, ...], body: SamplingFields) -> list[Completion]:
        await _held_if_asked(next(numbers))
        return await _generate(batcher, model, ids, body, timeout_s)

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, err: BadRequest) -> JSONResponse:
        return JSONResponse(status_code=400, content={"error": {"message": str(err), "type": "invalid_request_error",
                                                                "code": 400}})

    @app.exception_handler(EndpointClosed)
    async def closing(_: Request, err: EndpointClosed) -> JSONResponse:
        return JSONResponse(status_code=503, content={"error": {"message": str(err), "type": "unavailable", "code": 503}})

    @app.exception_handler(TimeoutError)
    async def timed_out(_: Request, err: TimeoutError) -> JSONResponse:
        return JSONResponse(status_code=504, content={"error": {
            "message": f"the engine did not answer within {timeout_s:.0f} s (busy training, or stopping); try again",
            "type": "timeout", "code": 504}})

    @app.get("/health", dependencies=[Depends(auth)])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model.name, "object": "model", "owned_by": "grpo_pipe",
                                            "max_model_len": model.max_model_len}]}

    @app.post("/v1/completions", dependencies=[Depends(auth)])
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        prompts = [_checked(model, ids, body) for ids in _completion_prompts(model, body.prompt)]
        outputs = await asyncio.gather(*[sample(ids, body) for ids in prompts])
        choices = [_completion_choice(model, i * body.n + j, ids, c, body.logprobs)
                   for i, (ids, samples) in enumerate(zip(prompts, outputs)) for j, c in enumerate(samples)]
        return _envelope("text_completion", model, choices, prompts)

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)])
    async def chat(body: ChatRequest) -> dict[str, Any]:
        ids = _checked(model, _chat_prompt(model, body), body)
        samples = await sample(ids, body)
        choices = [_chat_choice(model, j, c, body.logprobs) for j, c in enumerate(samples)]
        return {**_envelope("chat.completion", model, choices, [ids]), "prompt_token_ids": list(ids)}

    @app.post("/generate", dependencies=[Depends(auth)])
    async def generate(body: GenerateRequest) -> dict[str, Any]:
        raw = body.prompt if isinstance(body.prompt, str) else body.prompt.get("prompt_token_ids")
        if raw is None:
            raise BadRequest("prompt: give text or {'prompt_token_ids': [...]}")
        ids = _checked(model, _encode(model, raw) if isinstance(raw, str) else tuple(raw), body)
        samples = await sample(ids, body)
        return {
            "text": [c.text for c in samples],
            "token_ids": [list(c.token_ids) for c in samples],
            # per sample, per token: [{"<token id>": log-prob}], the shape vLLM's /generate gives and atroposlib reads
            "logprobs": [[[{str(t): lp}] for t, lp in zip(c.token_ids, c.logprobs)] for c in samples],
            "finish_reasons": [c.finish_reason for c in samples],
            "prompt_token_ids": list(ids),
            "policy_versions": [c.policy_version for c in samples],
        }

    @app.post("/inference/v1/generate", dependencies=[Depends(auth)])
    async def generate_tokens(body: TokensRequest) -> dict[str, Any]:
        ids = _checked(model, tuple(body.token_ids), body.sampling_params)
        samples = await sample(ids, body.sampling_params)
        return {"request_id": f"gen-{uuid.uuid4().hex}", "prompt_token_ids": list(ids),
                "choices": [_tokens_choice(j, c) for j, c in enumerate(samples)]}

    return app


def new_token() -> str:
    """A bearer token for one run: 32 random bytes as hex (a URL-safe token may start with `-`, which a command
    line then reads as a flag)."""
    return secrets.token_hex(32)


def _bearer(token: str) -> Any:
    expected = f"Bearer {token}"

    async def check(authorization: str | None = Header(None)) -> None:
        if authorization is None or not secrets.compare_digest(authorization.encode(), expected.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token (Authorization: Bearer <token>)")

    return check


def _completion_prompts(model: ServedModel, prompt: str | list[int] | list[str | list[int]]) -> list[tuple[int, ...]]:
    if isinstance(prompt, str):
        return [_encode(model, prompt)]
    if not prompt:
        raise BadRequest("prompt: empty")
    if all(isinstance(p, int) for p in prompt):
        return [tuple(prompt)]  # type: ignore[arg-type]
    return [_encode(model, p) if isinstance(p, str) else tuple(p) for p in prompt]  # type: ignore[arg-type]


def _encode(model: ServedModel, text: str) -> tuple[int, ...]:
    return tuple(model.tokenizer(text)["input_ids"])  # special tokens as the model adds them, as vLLM's server does


def _chat_prompt(model: ServedModel, body: ChatRequest) -> tuple[int, ...]:
    try:
        text = model.tokenizer.apply_chat_template(body.messages, tools=body.tools, add_generation_prompt=True,
                                                   tokenize=False)
    except Exception as err:  # the template's own complaint about these messages
        raise BadRequest(f"messages: the chat template cannot render them: {err}") from err
    return tuple(model.tokenizer(text, add_special_tokens=False)["input_ids"])


def _checked(model: ServedModel, ids: tuple[int, ...], body: SamplingFields) -> tuple[int, ...]:
    if body.stream:
        raise BadRequest("stream: streaming is not served; ask for the whole answer")
    if not ids:
        raise BadRequest("prompt: no tokens")
    outside = [t for t in ids if not 0 <= t < model.vocab_size]
    if outside:
        raise BadRequest(f"prompt: token ids outside the vocabulary (0..{model.vocab_size - 1}): {outside[:5]}")
    budget = _max_tokens(model, body)
    if len(ids) + budget > model.max_model_len:
        raise BadRequest(f"prompt of {len(ids)} tokens + max_tokens {budget} is more than the model's "
                         f"{model.max_model_len}; shorten the prompt or lower max_tokens")
    return ids


def _max_tokens(model: ServedModel, body: SamplingFields) -> int:
    return body.max_completion_tokens or body.max_tokens or model.default_max_tokens


async def _held_if_asked(number: int) -> None:
    """Hold request `number` when a test asks for `environment_request@<number>`; a real run pays one lookup."""
    if halt_request() is not None:
        await asyncio.to_thread(halt_point, "environment_request", number)  # blocks this request, not the event loop


async def _generate(batcher: RequestBatcher, model: ServedModel, ids: tuple[int, ...], body: SamplingFields,
                    timeout_s: float) -> list[Completion]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    key = SamplingKey(temperature=body.temperature, top_p=body.top_p, stop=tuple(stop),
                      stop_token_ids=tuple(body.stop_token_ids or ()))
    request = EngineRequest(prompt=ids, samples=body.n, max_tokens=_max_tokens(model, body), key=key, seed=body.seed)
    return await asyncio.wait_for(asyncio.wrap_future(batcher.submit(request)), timeout_s)


def _completion_choice(model: ServedModel, index: int, prompt: Sequence[int], c: Completion,
                       logprobs: int | None) -> dict[str, Any]:
    pieces = [model.tokenizer.decode([t]) for t in c.token_ids]
    choice: dict[str, Any] = {"index": index, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
    if logprobs is not None:
        offsets = [0, *itertools.accumulate(len(p) for p in pieces)][: len(pieces)]  # where each token's text starts
        choice["logprobs"] = {"tokens": pieces, "token_logprobs": list(c.logprobs),
                              "top_logprobs": [{p: lp} for p, lp in zip(pieces, c.logprobs)], "text_offset": offsets}
    return {**choice, **_provenance(c), "prompt_token_ids": list(prompt)}


def _chat_choice(model: ServedModel, index: int, c: Completion, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": c.text},
                              "finish_reason": c.finish_reason, "logprobs": None}
    if logprobs:
        pieces = [model.tokenizer.decode([t]) for t in c.token_ids]
        choice["logprobs"] = {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                                          for p, lp in zip(pieces, c.logprobs)]}
    return {**choice, **_provenance(c)}


def _tokens_choice(index: int, c: Completion) -> dict[str, Any]:
    """One sample as verifiers' train client reads it: ids, and per token `{"token": "token_id:<id>", "logprob"}`."""
    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(c.token_ids, c.logprobs)]
    return {"index": index, "finish_reason": c.finish_reason, "logprobs": {"content": content}, **_provenance(c)}


def _provenance(c: Completion) -> dict[str, Any]:
    """The engine's own tokens and the policy that sampled them."""
    return {"token_ids": list(c.token_ids), "policy_version": c.policy_version,
            "version_switches": [list(s) for s in c.version_switches]}


def _envelope(kind: str, model: ServedModel, choices: list[dict[str, Any]], prompts: Sequence[Sequence[int]]
              ) -> dict[str, Any]:
    generated = sum(len(c["token_ids"]) for c in choices)
    prompt_tokens = sum(len(p) for p in prompts)
    return {"id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
            "created": int(time.time()), "model": model.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}}
