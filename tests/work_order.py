"""The order in which `pytest -n 2 --dist loadgroup` hands out its units of work (an `xdist_group`, or a test of no
group): longest first, so that the two workers end together instead of one running a long job alone at the end.

xdist's own order is by the number of tests in a unit, which says little here: one test may be a whole job killed and
resumed four times (minutes), a module of forty tests a second of logic. The seconds below are what the longest units
took in a fresh-clone run on an idle 2-core machine (the calls and the module's shared fixtures); a unit not listed
counts a few seconds if it is in the integration tier, less in the others. A stale figure changes the order only, never
what a test checks. Refresh with `pytest --durations=80` when a long test is added or made shorter.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

# A unit's key: its group's name, or the test's node id when it is in none.
SECONDS = {
    "ray": 600,  # test_split, test_split_kill, test_multinode, test_sharded on one worker, one cluster at a time
    "tests/integration/tracking/test_outage.py": 120,
    "tests/integration/test_kill_points.py::test_sigkill_at_each_point_of_a_step_then_resume_loses_at_most_the_steps_"
    "since_the_checkpoint_and_mlflow_shows_it": 169,
    "tests/integration/test_resume.py": 110,
    "tests/integration/test_sweep_reward_weights.py::test_reward_weights_gives_a_child_per_setting_with_each_term": 82,
    "tests/integration/environments/test_kill_environment_request.py::test_sigkill_while_an_environments_request_is_"
    "served_leaves_no_process_and_the_resume_trains_every_step_once": 73,
    "tests/integration/test_sweeps.py::test_compare_bridges_gives_a_child_per_bridge_with_sync_metrics": 63,
    "tests/integration/test_kill_in_flight.py::test_sigkill_with_rollouts_in_flight_and_during_a_tool_call_then_"
    "resume_trains_every_group_once": 62,
    "tests/integration/benchmarks/test_rollout.py::test_rollout_benchmark_prints_raw_pipeline_and_step_figures": 61,
    "tests/integration/test_lint.py::test_pyright_finds_nothing": 58,
    "tests/integration/test_stopping.py::test_sigterm_during_a_2000_token_generation_exits_within_the_grace_with_a_"
    "checkpoint[generating_in_the_loop]": 58,
    "tests/integration/test_stopping.py::test_sigterm_during_a_2000_token_generation_exits_within_the_grace_with_a_"
    "checkpoint[generating_in_the_background]": 58,
    "tests/integration/test_mismatch.py::test_after_every_sync_the_engine_matches_the_trainer_to_numerics[nccl]": 55,
    "tests/integration/rewards/test_inference_aware.py": 50,
    "tests/integration/tracking/test_server.py": 50,
    "tests/integration/rollout/test_in_flight.py::test_a_sync_mid_generation_splits_every_running_sample_at_the_same_"
    "token[core_in_its_own_process]": 46,
    "tests/integration/test_stopping.py::test_sigterm_while_a_tool_hangs_exits_within_the_grace_with_the_last_"
    "checkpoint": 46,
    "tests/integration/benchmarks/test_sharded.py::test_sharded_benchmark_trains_both_world_sizes_alike_and_resumes_the_"
    "larger_at_the_smaller": 44,
    "tests/integration/benchmarks/test_learning.py::test_a_run_beside_trl_grades_every_snapshot_of_both": 44,
    "tests/integration/benchmarks/test_learning_tools.py::test_a_tool_job_beside_trl_grades_the_episodes_of_both": 44,
    "tests/integration/rewards/test_python_fn.py::test_a_reward_that_fails_only_on_real_completions_stops_the_run_with_"
    "one_paragraph": 40,
    "tests/integration/test_wheel_install.py": 38,
    "tests/integration/environments/test_atropos_environment.py::test_sigterm_stops_the_run_its_environments_and_the_"
    "api_server_within_the_grace": 34,
}
# A test in no list: an integration test starts a process or an engine now and then; the rest is logic.
INTEGRATION_S, OTHER_S = 5.0, 0.2


def group_of(item: pytest.Item) -> str | None:
    """The name xdist gives the item's `xdist_group` marks (joined, as `--dist loadgroup` does), or None."""
    groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                     for mark in item.iter_markers("xdist_group")})
    return "_".join(groups) if groups else None


def unit_of(item: pytest.Item) -> str:
    return group_of(item) or item.nodeid


def longest_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """`items` with each unit's tests together, the units by their seconds (listed or guessed), longest first; units of
    equal seconds in the collection's order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)

    def seconds(unit: str) -> float:
        if unit in SECONDS:
            return SECONDS[unit]
        return sum(INTEGRATION_S if item.get_closest_marker("integration") else OTHER_S for item in units[unit])

    ordered = sorted(units, key=lambda unit: -seconds(unit))  # stable: ties keep the collection's order
    return [item for unit in ordered for item in units[unit]]
