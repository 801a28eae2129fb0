"""What the async benchmark prints beside the phase medians: the median step and what its phases leave unexplained."""

import pytest

from grpo_pipe.benchmarks.async_loop import with_unaccounted


def test_the_median_step_and_the_unaccounted_rest_of_its_phases() -> None:
    row = with_unaccounted({"step_s": 7.9, "phases_s": {"rollouts_s": 0.65, "train_s": 1.03, "sync_s": 0.05, "step_s": 1.8}})
    assert row["median_step_s"] == 1.8 and row["step_s"] == 7.9  # the loop's mean per step is kept beside it
    assert row["phases_s"]["unaccounted_s"] == pytest.approx(1.8 - 0.65 - 1.03 - 0.05)
