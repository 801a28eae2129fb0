"""The engine's settings groups: what the config said, kept as said; the engine resolves a null for its machine."""

from __future__ import annotations

import pytest

from grpo_pipe.rollout.engine_settings import FeatureSettings, LayoutSettings
from grpo_pipe.rollout.vllm_engine import VllmEngine


def test_the_engine_keeps_a_speculative_config_of_its_own_and_an_empty_one_is_off() -> None:
    given = {"method": "ngram", "num_speculative_tokens": 3}
    features = FeatureSettings(speculative_config=given)
    assert features.speculative_config == given and features.speculative_config is not given  # vLLM writes into it
    assert FeatureSettings(speculative_config={}).speculative_config is None


@pytest.mark.parametrize(("in_process", "refused"), [(None, False), (False, False), (True, True)])
def test_device_ids_need_a_process_of_the_engines_own(in_process: bool | None, refused: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # A null resolves to a process of its own when device ids are set, so only an explicit true is refused.
    problems = LayoutSettings(device_ids="1", in_process=in_process).config_problems()
    assert bool(problems) is refused
    assert VllmEngine(layout=LayoutSettings(device_ids="1", in_process=in_process)).config_problems() == problems


def test_the_engine_resolves_where_it_runs_and_leaves_the_runners_choices_open() -> None:
    engine = VllmEngine(layout=LayoutSettings(device_ids="1"))
    assert engine.in_process is False and engine.layout.in_process is None  # resolved, and the config kept as said
    assert engine.background is None and engine.request_timestamps is None  # the runner decides these
    assert engine.device_ids == "1" and engine.enable_sleep_mode is False  # what the engine Protocols read


@pytest.mark.parametrize(("device_ids", "visible", "named"), [
    ("2", "0,1", "sees 2 GPU(s)"),      # past the cards this job was given
    ("one", None, "GPU indices"),       # not an index at all
    ("0,", None, "GPU indices"),
])
def test_device_ids_that_name_no_card_of_this_job_are_a_config_problem(device_ids: str, visible: str | None, named: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    (problem,) = LayoutSettings(device_ids=device_ids, in_process=False).config_problems()
    assert problem.startswith(f"rollout.layout.device_ids={device_ids!r}") and named in problem


def test_device_ids_within_the_visible_cards_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert LayoutSettings(device_ids="1", in_process=False).config_problems() == []

