"""Overrides checked before Hydra runs: unknown keys named with the nearest allowed ones; nothing else judged."""

from grpo_pipe.config.overrides import unknown_key_problems


def test_every_unknown_key_is_named_with_the_nearest_allowed_names() -> None:
    problems = unknown_key_problems(["trainer.lrr=1", "run.tempreature=0.5", "trainer.steps=2"])
    assert [p.split(";")[:2] for p in problems] == [
        ["trainer.lrr: unknown key", " nearest: trainer.lr"],
        ["run.tempreature: unknown key", " nearest: run.temperature"],
    ]


def test_keys_of_the_option_the_command_picks_are_known() -> None:
    assert unknown_key_problems(["data=jsonl", "data.train_path=tasks.jsonl", "+sweeps=reward_weights"]) == []


def test_sweeps_and_appended_keys_are_left_to_hydra() -> None:
    assert unknown_key_problems(["-m", "data=jsonl,hf", "data.train_path=tasks.jsonl"]) == []  # keys differ per job
    assert unknown_key_problems(["-m", "reward.wrong=0.0,-0.2"]) == []
    assert unknown_key_problems(["+trainer.extra=1"]) == []  # appended on purpose: the validator judges it
