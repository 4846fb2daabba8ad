"""benchmarks.imagined_vs_real's summaries on small made-up outcomes: episode agreement and Cohen's kappa, and whether
a world model ranks the tasks as the simulator does."""

from __future__ import annotations

import pytest

from benchmarks.imagined_vs_real import correlation, kappa_of, task_ranking


def test_kappa_is_zero_for_outcomes_that_carry_no_information_and_one_for_the_same_outcomes():
    independent = kappa_of([(True, True), (True, False), (False, True), (False, False)])
    assert independent["agreement"] == 0.5 and independent["kappa"] == pytest.approx(0.0)
    same = kappa_of([(True, True), (False, False), (True, True)])
    assert same["kappa"] == pytest.approx(1.0) and same["real_failure_imagined_failure"] == 1
    assert kappa_of([(True, True), (True, True)])["kappa"] is None  # both always succeed: undefined


def test_the_tasks_are_ranked_by_their_success_over_all_checkpoints():
    # task a: real 1/2 then 2/2, imagined 2/2 both times; task b: real 0/2 then 1/2, imagined 0/2 then 1/2
    rows = [{"per_task": {"a": kappa_of([(True, True), (False, True)]),
                          "b": kappa_of([(False, False), (False, False)])}},
            {"per_task": {"a": kappa_of([(True, True), (True, True)]),
                          "b": kappa_of([(True, True), (False, False)])}}]
    ranking = task_ranking(rows)
    assert ranking["per_task"] == {"a": {"real": 0.75, "imagined": 1.0}, "b": {"real": 0.25, "imagined": 0.25}}
    assert ranking["pearson_across_tasks"] == pytest.approx(1.0)  # two tasks, ordered alike
    # cells (real, imagined): (0.5, 1), (0, 0), (1, 1), (0.5, 0.5)
    assert ranking["pearson_across_cells"] == pytest.approx(correlation([0.5, 0, 1, 0.5], [1, 0, 1, 0.5]))
    assert 0 < ranking["pearson_across_cells"] < 1


def test_a_correlation_is_undefined_for_one_value_or_a_constant_side():
    assert correlation([0.5], [0.2]) is None
    assert correlation([0.1, 0.9], [0.7, 0.7]) is None
    # 0.28 / sqrt(0.32 * 0.26), by hand
    assert correlation([0.1, 0.5, 0.9], [0.2, 0.4, 0.9]) == pytest.approx(0.9707, abs=1e-4)
