"""A micro-batch's loss and mismatch statistics never make the host wait for the card (read once per pass)."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from grpo_pipe.trainer.mismatch import mismatch_sums
from tests.conftest import CONF

LOSSES = [[f"loss={p.stem}"] for p in sorted((CONF / "loss").glob("*.yaml"))]
CORRECTIONS = [["loss=grpo", f"loss/correction={p.stem}"] for p in sorted((CONF / "loss" / "correction").glob("*.yaml"))]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: torch reports host synchronisations there")
@pytest.mark.parametrize("overrides", [*LOSSES, *CORRECTIONS, ["loss=grpo", "loss.kl_coef=0.01", "loss.entropy_coef=0.01"]],
                         ids=lambda o: " ".join(o))
def test_a_micro_batchs_loss_and_statistics_queue_without_a_host_synchronisation(compose_cfg, overrides) -> None:
    loss = instantiate(compose_cfg(overrides).loss, _convert_="object")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    new = (-torch.rand(8, 64, generator=gen, device=device) * 3).requires_grad_()
    old = new.detach() + 0.1 * torch.randn(8, 64, generator=gen, device=device)
    mask = (torch.rand(8, 64, generator=gen, device=device) > 0.2).float()
    advantages = torch.randn(8, generator=gen, device=device)
    entropy = torch.rand(8, 64, generator=gen, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronisation raises
    try:
        value, _ = loss(new, old, advantages, mask, 512.0, ref_logprobs=old, proximal_logprobs=new.detach(),
                        entropy=entropy)
        value.backward()
        mismatch_sums(new, old, mask, loss.trust_region, entropy)
    finally:
        torch.cuda.set_sync_debug_mode("default")
