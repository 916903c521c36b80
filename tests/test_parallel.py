"""pytest-xdist: timed cases on a shared device are refused; untimed deterministic checks run in parallel."""


CASES = """
import pytest
from trainbench.plugin import recipe_params

@pytest.mark.parametrize("recipe", recipe_params("baseline", "set_to_none"))
def test_mlp(train_bench, recipe):
    train_bench(recipe, "mlp")
"""

# A speed bound no run can meet and a deterministic bound no run can meet.
BUDGETS = """
[cpu."mlp-set_to_none"]
min_speedup = 100
[cpu."mlp-baseline"]
max_ops_per_step = 1
"""


def test_timed_cases_on_workers_sharing_a_device_are_refused_with_the_reason(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest("-n", "2", *quick_options)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([("*trainbench: timed case refused: 2 pytest-xdist workers share * (cpu), and cases "
                                 "timed side by side measure each other. Run it without -n*--benchmark-disable*")])


def test_with_benchmark_disable_workers_judge_the_deterministic_budgets_and_not_the_timed_ones(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    pytester.makefile(".toml", budgets=BUDGETS)
    result = pytester.runpytest("-n", "2", "--benchmark-disable", "--trainbench-budgets=budgets.toml", "-rA", *quick_options)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*mlp-baseline [[]cpu[]]: ops_per_step: measured * vs budget <= 1*"])
    result.stdout.no_fnmatch_line("*samples_per_s ratio vs baseline*")


def test_one_worker_times_its_cases(pytester, quick_options):
    pytester.makepyfile(test_cases=CASES)
    pytester.runpytest("-n", "1", "-k", "baseline", *quick_options).assert_outcomes(passed=1)
