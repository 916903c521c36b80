"""Where a case's wall time goes: the ledger's arithmetic on a virtual clock, a case's phases, the summary's table."""

import pytest

from trainbench.core.harness import costs
from trainbench.core.harness.costs import BASELINE, OTHER, PHASES, TOTAL, by_phase, case_ledger, in_child_process, spent


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_nested_phases_count_once_in_the_innermost_and_the_rest_is_other():
    clock = Clock()
    with case_ledger(clock) as ledger:
        clock.now += 1  # planning: no phase
        with spent("setup"):
            clock.now += 2
            with spent("warm-up"):
                clock.now += 3
        with spent("rounds", baseline=True):
            clock.now += 4
        with spent("rounds"):
            clock.now += 5
    closed = ledger.closed()
    assert closed == {"setup": 2, "warm-up": 3, BASELINE + "rounds": 4, "rounds": 5, OTHER: 1, TOTAL: 15}
    assert costs.timed_rounds_s(closed) == 9 and by_phase(closed)["rounds"] == 9
    assert list(by_phase(closed)) == [*PHASES, OTHER]


def test_a_child_process_s_phases_are_its_own_and_its_start_is_setup():
    clock = Clock()
    with case_ledger(clock) as ledger:
        with in_child_process(baseline=True) as child:
            clock.now += 10  # the whole wait for the child
            child.phase_seconds = {"warm-up": 3, "rounds": 4, "setup": 1}
    assert ledger.closed() == {BASELINE + "setup": 3, BASELINE + "warm-up": 3, BASELINE + "rounds": 4, OTHER: 0,
                               TOTAL: 10}


def test_no_ledger_no_cost_and_an_unknown_phase_is_a_bug():
    with spent("rounds"):  # asv, a rank process: nothing records
        pass
    with pytest.raises(AssertionError):
        with spent("lunch"):
            pass


def test_a_case_records_its_phases_and_its_baseline_s_share(cpu, profile, quick):
    from trainbench.core.analyses.predict import PredictionCache
    from trainbench.core.method.runner import Runner

    runner = Runner(cpu, profile, quick, predictions=PredictionCache(cpu), pair_baselines=True)
    outcome = runner.run("set_to_none", "mlp")
    seconds = outcome.result.phase_seconds
    assert {"setup", "warm-up", "rounds", "peaks", "calls", "memory", "work", "guard", TOTAL} <= set(seconds)
    assert {BASELINE + "setup", BASELINE + "rounds"} <= set(seconds)  # paired: the baseline's share is the case's
    assert abs(sum(v for k, v in seconds.items() if k != TOTAL) - seconds[TOTAL]) < 1e-6


def test_the_costs_option_prints_each_case_s_phases_and_the_rounds_share(pytester, quick_options):
    pytester.makepyfile(test_costs_here="""
        def test_one(train_bench):
            train_bench("set_to_none", "mlp")
    """)
    result = pytester.runpytest(*quick_options, "--trainbench-costs")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    costs_part = out.split("trainbench costs", 1)[1]
    assert "mlp-set_to_none" in costs_part and "all cases" in costs_part
    assert "timed rounds:" in costs_part and "of the session" in costs_part


def test_a_quick_run_keeps_the_rounds_and_the_passes_its_budget_needs_and_says_what_it_skipped(pytester, quick_options):
    pytester.makefile(".toml", budgets='[cpu."mlp-set_to_none"]\nmax_ops_per_step = 1e9\nmin_samples_per_s = 1\n')
    pytester.makepyfile(test_quick="""
        def test_one(train_bench):
            result = train_bench("set_to_none", "mlp")
            assert result.ops_per_step > 0 and result.round_step_times_s  # what the budget names
            assert result.memory_breakdown_bytes == {} and result.aten_calls_per_step is None  # not asked for
            assert any("quick run: the peaks, calls, memory passes skipped" in note for note in result.notes), result.notes
            assert any("correctness guard" in note and "skipped" in note for note in result.notes), result.notes
            seconds = result.phase_seconds
            assert "rounds" in seconds and "work" in seconds and not {"memory", "calls", "guard"} & set(seconds)
    """)
    result = pytester.runpytest(*quick_options, "--trainbench-quick")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("option", ["--benchmark-save=x", "--benchmark-autosave", "--trainbench-ab=python3"])
def test_a_quick_run_is_refused_where_it_would_be_compared_or_kept(pytester, quick_options, option):
    pytester.makepyfile(test_quick="def test_one(train_bench):\n    train_bench('baseline', 'mlp')\n")
    result = pytester.runpytest(*quick_options, "--trainbench-quick", option)
    assert result.ret == 4  # a usage error, before any case
    result.stderr.fnmatch_lines([f"*--trainbench-quick with {option.split('=')[0]}*"])


def test_a_long_session_forecasts_its_cost_after_the_first_case():
    assert costs.cost_forecast("a", 10.0, 5) is None  # 50 s: not long
    line = costs.cost_forecast("gpt-baseline", 40.0, 8)
    assert line.startswith("trainbench: gpt-baseline took 40 s; the 8 other cases collected will take about 5 min")
    assert costs.cost_forecast("a", 1000.0, 0) is None  # the last case: nothing to forecast


def test_the_forecast_line_appears_after_the_first_case(pytester, quick_options, monkeypatch):
    monkeypatch.setattr(costs, "FORECAST_AFTER_S", 0.0)  # every session is long
    pytester.makepyfile(test_two="""
        import pytest

        @pytest.mark.parametrize("recipe", ["baseline", "set_to_none"])
        def test_one(train_bench, recipe):
            train_bench(recipe, "mlp")
    """)
    result = pytester.runpytest(*quick_options)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["trainbench: mlp-baseline took * s; the 1 other case collected will take about *"])
    assert result.stdout.str().count("other case collected") == 1


def test_a_process_first_optimizer_imports_nothing_once_the_core_is_loaded():
    """torch.optim's first optimizer imports torch._dynamo (~1 s, torch._disable_dynamo): the core takes it at import,
    so that second is the process's start-up, not the first case's setup (this suite's process has it already)."""
    import subprocess
    import sys

    code = ("import sys, torch, trainbench.core.setups.training\n"
            "before = set(sys.modules)\n"
            "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
            "new = sorted(set(sys.modules) - before)\n"
            "print(len(new), new[:5])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0 []", done.stdout  # without it: ~1,000 modules, torch._dynamo's among them
