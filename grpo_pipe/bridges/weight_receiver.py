"""Engine-side half of the broadcast bridge, mixed into vLLM's worker (`worker_extension_cls`).

Runs inside the engine's process. The trainer sends a plan (bucket dtypes, names, shapes) through
`collective_rpc`, then broadcasts each bucket as one flat tensor; the worker unpacks views into that
buffer and hands them to vLLM's own loader, which fuses qkv / gate_up itself.
"""

from __future__ import annotations

import torch

import time

from grpo_pipe.bridges.collective import Bucket, broadcast, join_group, unpack


class WeightReceiverExtension:
    """Methods added to the vLLM worker; `self` is the worker."""

    def grpo_open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        self._grpo_group, self._grpo_store = join_group(backend, host, port, timeout_s, world_size)

    def grpo_receive_weights(self, wire_plan: list[dict]) -> dict[str, float]:
        """Receive every bucket and load it. Returns bytes received and the receive / load times.

        On GPU each bucket is handed to vLLM's loader as soon as it arrives: the loader's copies are
        queued on the compute stream and overlap the next bucket's broadcast on NCCL's stream. The
        CPU reload path repacks whole layers, so there all buckets are loaded together at the end.
        """
        started = time.perf_counter()
        device = torch.device(self.device) if hasattr(self, "device") else torch.device("cpu")
        received: list[tuple[str, torch.Tensor]] = []
        nbytes = 0
        for bucket in map(Bucket.from_wire, wire_plan):
            flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
            broadcast(self._grpo_group, flat)
            nbytes += flat.numel() * flat.element_size()
            if device.type == "cpu":
                received.extend(unpack(flat, bucket))
            else:
                self.model_runner.model.load_weights(weights=unpack(flat, bucket))
        arrived = time.perf_counter()
        if device.type == "cpu":
            from grpo_pipe.rollout.vllm_engine import _refresh_cpu_tied_lm_head

            self.reload_weights(weights_iterator=iter(received))
            _refresh_cpu_tied_lm_head(self)
        else:
            torch.cuda.synchronize(device)
        return {"bytes": float(nbytes), "receive_s": arrived - started, "load_s": time.perf_counter() - arrived}

    def grpo_receive_raw(self, nbytes: int) -> None:
        """Receive one flat buffer and drop it: the transport floor, for benchmarks."""
        device = self.device if hasattr(self, "device") else torch.device("cpu")
        broadcast(self._grpo_group, torch.empty(nbytes, dtype=torch.uint8, device=device))

    def grpo_close_weight_group(self) -> None:
        for attr in ("_grpo_group", "_grpo_store"):
            if hasattr(self, attr):
                delattr(self, attr)
