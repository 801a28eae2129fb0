"""TRL 1.16's own tool loop on our episodes (CPU: TRL generating with transformers): it accepts the tool template
without replacing it, starts from our prompt tokens, feeds a result back as exactly our glue tokens, and trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from grpo_pipe.benchmarks.trl_peer import PeerSettings, completion_text, train_trl
from grpo_pipe.benchmarks.trl_tools import ToolPeer, tool_peer
from grpo_pipe.environments.chat_glue import ChatGlue
from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.types import Task
from tests.fixtures.calculator_demo import DEMONSTRATION, SYSTEM

trl = pytest.importorskip("trl", reason="the TRL peer needs `pip install trl==1.16.0` (the `peer` extra)")
datasets = pytest.importorskip("datasets")

TASKS = [Task(uid=f"t/{i}", question=f"Calculate {i} * 12.", answer=str(i * 12)) for i in range(8)]


def _peer(model_path: Path) -> tuple[ToolEnvironment, ToolPeer]:
    episodes = ToolEnvironment(tools=["calculator"], tool_options={"calculator": {"max_operations": 1}},
                               demonstration=DEMONSTRATION, max_turns=3, max_episode_tokens=48)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    episodes.setup(tokenizer, SYSTEM, 512)
    return episodes, tool_peer(episodes, tokenizer, SYSTEM)


def test_trl_takes_our_template_and_feeds_a_result_back_as_our_glue_tokens(tmp_path: Path) -> None:
    model_path = TinyRandomModel().materialize()
    episodes, peer = _peer(model_path)
    conversations = [peer.conversation(task) for task in TASKS]
    trainer = trl.GRPOTrainer(
        model=str(model_path), reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                            use_vllm=False, report_to=[], max_completion_length=48, bf16=False),
        train_dataset=datasets.Dataset.from_dict({"prompt": conversations}),
        processing_class=peer.tokenizer(model_path), tools=peer.functions,
    )
    assert trainer.chat_template is None  # prefix-preserving: TRL renders with our template, not a training one
    prompt_ids, _, _ = trainer._tokenize_prompts(conversations)
    assert [list(ids) for ids in prompt_ids] == [list(episodes.render_prompt(task)) for task in TASKS]
    result = episodes.call_format.result_message("75")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ours = ChatGlue(tokenizer, peer.system_prompt).after_turn(result, model_ended_turn=True)
    theirs = trainer._get_tool_suffix_ids([{"role": "tool", "name": "calculator", "content": result["content"]}])
    assert list(theirs) == list(ours)
    assert tokenizer.decode(ours) == "\n<|im_start|>tool\n<tool_response>75</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_trl_trains_with_our_tools_under_the_budget(tmp_path: Path) -> None:
    model_path = TinyRandomModel().materialize()
    _, peer = _peer(model_path)
    seen: list[Any] = []

    def by_length(completions: list[Any], **_: Any) -> list[float]:  # the random model never answers right
        seen.extend(completions)
        return [float(len(completion_text(c)) % 2) for c in completions]

    settings = PeerSettings(lr=1e-2, warmup_steps=0, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=48,
                            temperature=1.0, top_p=1.0, clip_low=0.2, clip_high=0.28, grad_clip=1.0,
                            micro_batch_size=4, seed=0, use_vllm=False, max_turn_tokens=12,
                            max_tool_calling_iterations=2)
    run = train_trl(model_path, [peer.conversation(t) for t in TASKS], [t.answer for t in TASKS], settings,
                    budget_s=5.0, mark_every_s=100.0, out_dir=tmp_path, reward_fn=by_length, tools=peer)
    assert run.steps >= 1 and len(run.step_rewards) == run.steps
    assert all("tools/call_frequency" in log for log in run.step_logs)  # TRL's own tool loop ran
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen)  # episodes as messages
    assert load_file(run.snapshots[-1].path / "model.safetensors")
