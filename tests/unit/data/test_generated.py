"""The splits of a generator: each made once, the held-out one from its own seed and never holding a train question."""

from grpo_pipe.data.generated import EVAL_SEED_OFFSET, GeneratedSplits
from grpo_pipe.types import Task


class Counting:
    """Questions `q<n mod period>` from a seed, counting its calls."""

    def __init__(self, period: int) -> None:
        self.period, self.calls = period, []

    def __call__(self, size: int, seed: int, split: str) -> list[Task]:
        self.calls.append((size, seed, split))
        return [Task(uid=f"{split}/{i}", question=f"q{(seed + i) % self.period}", answer="0") for i in range(size)]


def test_each_split_is_generated_once_and_eval_from_its_own_seed() -> None:
    generate = Counting(period=10**9)
    splits = GeneratedSplits(generate, train_size=3, eval_size=2, seed=5, oversample=3)
    assert splits.eval() == splits.eval() and splits.train() is splits.train()
    assert generate.calls == [(6, 5 + EVAL_SEED_OFFSET, "eval"), (3, 5, "train")]


def test_held_out_questions_are_unseen_and_each_once_with_a_warning_when_short(caplog) -> None:
    # Train holds q0 q1 q2; the 12 eval candidates (seed 0 + 1_000_003, so from q3) repeat q3 q0 q1 q2.
    splits = GeneratedSplits(Counting(period=4), train_size=3, eval_size=3, seed=0, oversample=4, name="counting")
    held_out = splits.eval()
    assert [t.question for t in held_out] == ["q3"] and held_out[0].uid == "eval/8"  # its first place, its last copy
    assert "data.eval_size=3 but only 1 counting questions are not in the train split" in caplog.text


def test_arrange_picks_the_held_out_split_from_what_is_left() -> None:
    splits = GeneratedSplits(Counting(period=10**9), train_size=1, eval_size=2, seed=0,
                             arrange=lambda tasks, size: tasks[::-1][:size])
    assert [t.uid for t in splits.eval()] == ["eval/3", "eval/2"]
