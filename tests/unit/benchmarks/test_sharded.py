"""The sharded-trainer benchmark's batches."""

from grpo_pipe.benchmarks.sharded import batches


def test_benchmark_batches_are_seeded_and_every_group_carries_signal() -> None:
    first, again = batches(2, 3, 4, 5, 6, vocab=512), batches(2, 3, 4, 5, 6, vocab=512)
    assert first == again
    groups, rewards = first[0]
    assert len(groups) == 3 and all(len(g.completions) == 4 for g in groups)
    assert all(len(g.prompt_token_ids) == 5 and all(len(c.token_ids) == 6 for c in g.completions) for g in groups)
    assert all(len(set(rewards[i * 4 : i * 4 + 4])) == 2 for i in range(3))  # right and wrong in every group
    assert first[0][0][0].prompt_token_ids != first[1][0][0].prompt_token_ids  # each step its own batch
