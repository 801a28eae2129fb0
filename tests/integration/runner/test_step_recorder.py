"""Where a step's time goes: each phase per step, and its median over the loop in the run summary."""

from grpo_pipe.runner.step_recorder import StepRecorder


def _step(recorder: StepRecorder, reward_s: float) -> dict[str, float]:
    recorder.begin()
    with recorder.phase("schedule"):
        pass
    recorder.add({"time/reward_s": reward_s, "train/reward/mean": 0.5})
    return recorder.end(step=1, policy_version=1, engine_restarts=0)


def test_a_phase_is_a_step_metric_in_seconds() -> None:
    metrics = _step(StepRecorder(samples_to_log=0), reward_s=0.1)
    assert 0.0 <= metrics["time/schedule_s"] <= metrics["time/step_s"]


def test_the_summary_gives_each_phase_median_leaving_out_the_first_step() -> None:
    recorder = StepRecorder(samples_to_log=0)
    for reward_s in (9.0, 1.0, 3.0, 2.0):  # the first step's 9.0 (warm-up) must not count
        _step(recorder, reward_s=reward_s)
    summary = recorder.phase_summary()
    assert summary["summary/phase/reward_s"] == 2.0
    assert "summary/phase/train_s" not in summary  # no step trained: no phase reported as zero


def test_with_two_steps_every_step_counts() -> None:
    recorder = StepRecorder(samples_to_log=0)
    for reward_s in (4.0, 2.0):
        _step(recorder, reward_s=reward_s)
    assert recorder.phase_summary()["summary/phase/reward_s"] == 3.0
