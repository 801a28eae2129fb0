"""GSM8K as an Atropos environment, written on atroposlib's BaseEnv the way the Atropos trainer's quick start runs it:
each problem is sampled `group_size` times through the trainer's endpoint (ManagedServer over vLLM's `/generate`, so
the tokens and log-probs posted are the engine's own), each answer scored 1 if its number after `####` equals the
reference (`--env.format_score S`: a wrong number in the asked format scores S, the shaping a small model needs to get
any signal at all), and the group posted to the Atropos API. `evaluate` grades the first `eval_rows` test problems greedily.

    python -m grpo_pipe environment=atropos reward=environment model=smollm2_135m \
        "environment.environments=[[examples/atropos_gsm8k/gsm8k_server.py,serve,--env.data_dir,DIR]]"

DIR holds GSM8K's `train.jsonl` and `test.jsonl` (rows `{"question": ..., "answer": "... #### 72"}`).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

SYSTEM_PROMPT = "Solve the math problem step by step. End your reply with the final answer as: #### <number>"
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class Gsm8kConfig(BaseEnvConfig):
    data_dir: str = Field(default="data/gsm8k", description="folder with GSM8K's train.jsonl and test.jsonl")
    max_new_tokens: int = Field(default=256, description="tokens per answer")
    temperature: float = Field(default=1.0, description="sampling temperature of training groups")
    eval_rows: int = Field(default=64, description="test problems graded by evaluate (greedy)")
    seed: int = Field(default=0, description="order of the training problems")
    format_score: float = Field(default=0.0, ge=0.0, lt=1.0,
                                description="score of a wrong answer given in the asked format (#### <number>)")


def read_rows(path: Path) -> list[tuple[str, str]]:
    """(question, final answer) of each row; a row without a number after `####` is named and refused."""
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
        if "####" not in str(row["answer"]) or not NUMBER.fullmatch(final):
            raise ValueError(f"{path}:{line_no}: no numeric final answer after '####'")
        rows.append((str(row["question"]).strip(), final))
    return rows


def final_answer(text: str) -> str | None:
    """The number after the last `####` of a reply, commas removed; None when the reply gives none."""
    if "####" not in text:
        return None
    found = NUMBER.search(text.rsplit("####", 1)[1])
    return found.group(0).replace(",", "") if found else None


def is_correct(reply: str, reference: str) -> bool:
    answer = final_answer(reply)
    return answer is not None and float(answer) == float(reference)


def score(reply: str, reference: str, format_score: float) -> float:
    """1 for the right number after `####`; `format_score` for a wrong one in that format; 0 for no answer."""
    if is_correct(reply, reference):
        return 1.0
    return format_score if final_answer(reply) is not None else 0.0


class Gsm8kServer(BaseEnv):
    name = "gsm8k"

    @classmethod
    def config_init(cls) -> tuple[Gsm8kConfig, list[APIServerConfig]]:
        # max_num_workers_per_node: problems sampled at once (atroposlib's default, 8, leaves a fast engine idle
        # between small bursts; it still caps them at what fits its queue of max_batches_offpolicy batches).
        env = Gsm8kConfig(group_size=8, use_wandb=False, wandb_name="gsm8k", max_token_length=1024,
                          total_steps=1000, ensure_scores_are_not_same=False, batch_size=64,
                          steps_per_eval=1_000_000, max_num_workers_per_node=32)
        return env, [APIServerConfig(model_name="grpo_pipe", server_type="vllm", num_requests_for_eval=64)]

    async def setup(self) -> None:
        folder = Path(self.config.data_dir)
        self.train = read_rows(folder / "train.jsonl")
        self.test = read_rows(folder / "test.jsonl")[: self.config.eval_rows]
        random.Random(self.config.seed).shuffle(self.train)
        self.next_row = 0

    async def get_next_item(self) -> tuple[str, str]:
        item = self.train[self.next_row % len(self.train)]
        self.next_row += 1
        return item

    def prompt(self, question: str) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    async def collect_trajectories(self, item: tuple[str, str]) -> tuple[ScoredDataGroup, list]:
        question, reference = item
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.completion(prompt=self.prompt(question), n=self.config.group_size,
                                     max_tokens=self.config.max_new_tokens, temperature=self.config.temperature)
            nodes = managed.get_state()["nodes"]
        # The reply is what the engine sampled: the positions the mask keeps (the prompt's are -100).
        replies = [self.tokenizer.decode([t for t in node.masked_tokens if t != -100]) for node in nodes]
        group = ScoredDataGroup(tokens=[node.tokens for node in nodes], masks=[node.masked_tokens for node in nodes],
                                scores=[score(reply, reference, self.config.format_score) for reply in replies],
                                inference_logprobs=[node.logprobs for node in nodes])
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        """Greedy accuracy on the first `eval_rows` test problems, through the same endpoint."""
        async def grade(question: str, reference: str) -> bool:
            async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
                done = await managed.completion(prompt=self.prompt(question), n=1,
                                                max_tokens=self.config.max_new_tokens, temperature=0.0)
            return is_correct(done.choices[0].text, reference)

        # All at once: the engine batches them, as it batches training groups.
        correct = sum(await asyncio.gather(*(grade(question, reference) for question, reference in self.test)))
        await self.evaluate_log({"accuracy": correct / max(len(self.test), 1), "problems": float(len(self.test))},
                                verbose=False)


if __name__ == "__main__":
    Gsm8kServer.cli()
