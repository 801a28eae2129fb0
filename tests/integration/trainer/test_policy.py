"""The policies' exports: what a sync writes must be the weights as they are now, in the dtype asked for."""

import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.policy import FullFinetunePolicy, LoraPolicy
from grpo_pipe.trainer.settings import OptimisationSettings
from tests.fakes import scored_groups


def test_each_saved_adapter_holds_the_weights_of_its_moment(tmp_path) -> None:
    torch.manual_seed(0)
    trainer = GRPOTrainer(policy=LoraPolicy(rank=4), steps=3, optimisation=OptimisationSettings(lr=1e-2))
    trainer.setup(TinyRandomModel().materialize(), torch.device("cpu"), pad_id=0)
    policy = trainer.policy
    policy.save_adapter(tmp_path / "v0")
    groups, rewards = scored_groups()
    trainer.step(groups, rewards, temperature=1.0)
    policy.save_adapter(tmp_path / "v1")
    policy.save_adapter(tmp_path / "v1-bf16", dtype=torch.bfloat16)
    saved = [load_file(tmp_path / v / "adapter_model.safetensors") for v in ("v0", "v1", "v1-bf16")]
    now = {k: v.detach() for k, v in get_peft_model_state_dict(policy.module).items()}
    assert saved[1].keys() == now.keys() and all(torch.equal(saved[1][k], now[k]) for k in now)
    assert any(not torch.equal(saved[0][k], saved[1][k]) for k in now)  # the step moved the adapter
    assert all(saved[2][k].dtype == torch.bfloat16 and torch.equal(saved[2][k], now[k].bfloat16()) for k in now)
    assert (tmp_path / "v1" / "adapter_config.json").exists()


def test_a_checkpoint_cast_for_the_engine_has_the_same_tensors_in_its_dtype(tmp_path) -> None:
    policy = FullFinetunePolicy()
    policy.load(TinyRandomModel().materialize(), torch.device("cpu"), torch.float32)
    policy.save_pretrained(tmp_path / "f32")
    policy.save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    f32, bf16 = (load_file(tmp_path / v / "model.safetensors") for v in ("f32", "bf16"))
    assert f32.keys() == bf16.keys()  # tied weights are handled the same way
    assert all(bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k], f32[k].bfloat16()) for k in f32)
