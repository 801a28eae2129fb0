from grpo_pipe.tracking.comparison_plots import since_first_step
from grpo_pipe.tracking.sweep_runs import ChildResult
from grpo_pipe.tracking.verdict import points_of, verdict


def child(bridge: str, seed: int | None, accuracy: float, direction: str = "maximize") -> ChildResult:
    overrides = {"weight_bridge": bridge, **({"run.seed": str(seed)} if seed is not None else {})}
    return ChildResult(run_id=f"{bridge}{seed}", name=bridge, status="FINISHED", overrides=overrides,
                       objective="eval/accuracy", direction=direction, last={"eval/accuracy": accuracy})


SWEPT = ["run.seed", "weight_bridge"]


def test_repeats_over_seeds_are_one_point_with_a_mean_and_a_spread() -> None:
    points = points_of([child("lora", 0, 0.5), child("lora", 1, 0.7), child("reload", 0, 0.4)], SWEPT)
    lora, reload = points
    assert (lora.label, lora.values, reload.values) == ("weight_bridge=lora", (0.5, 0.7), (0.4,))
    assert abs(lora.mean - 0.6) < 1e-12 and abs((lora.spread or 0) - 0.1414) < 1e-3 and reload.spread is None


def test_a_gap_wider_than_the_spread_is_a_win() -> None:
    runs = [child("lora", s, v) for s, v in enumerate((0.70, 0.72, 0.71))]
    runs += [child("reload", s, v) for s, v in enumerate((0.50, 0.52, 0.51))]
    answer = verdict(runs, SWEPT)
    assert answer is not None and answer.text.startswith("weight_bridge=lora wins on eval/accuracy")
    assert [p.label for p in answer.points] == ["weight_bridge=lora", "weight_bridge=reload"]


def test_a_gap_inside_the_spread_is_a_tie() -> None:
    runs = [child("lora", s, v) for s, v in enumerate((0.60, 0.75, 0.70))]
    runs += [child("reload", s, v) for s, v in enumerate((0.62, 0.68, 0.65))]
    answer = verdict(runs, SWEPT)
    assert answer is not None and answer.text.startswith("Tie within the spread on eval/accuracy")


def test_with_one_seed_per_point_the_margin_is_unknown() -> None:
    answer = verdict([child("reload", None, 0.308), child("nccl", None, 0.300)], ["weight_bridge"])
    assert answer is not None and answer.text.startswith("weight_bridge=reload leads on eval/accuracy by 0.008")
    assert "margin unknown: one seed per point" in answer.text and "run.seed=0,1,2" in answer.text


def test_equal_scores_are_a_tie_and_minimize_picks_the_lowest() -> None:
    tie = verdict([child("reload", None, 0.0), child("nccl", None, 0.0)], ["weight_bridge"])
    assert tie is not None and tie.text == "Tie on eval/accuracy at 0: weight_bridge=reload; weight_bridge=nccl."
    low = verdict([child("reload", None, 2.0, "minimize"), child("nccl", None, 1.0, "minimize")], ["weight_bridge"])
    assert low is not None and low.points[0].label == "weight_bridge=nccl"


def test_no_objective_logged_is_no_verdict() -> None:
    silent = child("reload", None, 0.0)
    silent.last = {}
    assert verdict([silent], ["weight_bridge"]) is None


def test_wall_clock_curves_start_at_each_runs_first_step() -> None:
    # The evaluation before training (at 0.2 min) and the first step at 1.5 min: set-up is left out.
    assert since_first_step([(0.2, 0.0), (2.5, 0.4), (3.5, 0.6)], 1.5) == [(0.0, 0.0), (1.0, 0.4), (2.0, 0.6)]
    assert since_first_step([(0.5, 0.1)], None) == [(0.5, 0.1)]
