"""Every --trainbench-* option and every TRAINBENCH_* variable, given any value: it reads as documented, or it is
refused at start-up in one line (pytest's UsageError, host.EnvError), never another error or a second line.

The options are drawn from their own table (``options.add_options``) with the types pytest's parser hands over (an int
option an int, a float one any float, nan and inf included, text any text) and read by ``Options.from_config``; the
variables from ``host.ENVIRONMENT``, read by ``host.env_value``. No pytest session runs per example."""

import math
import os
import re
import string
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trainbench.core.records.metrics import METRICS
from trainbench.devices.fleet import FLEET, Gpu
from trainbench.devices.host import ENVIRONMENT, SWITCHES, EnvError, env_value
from trainbench.plugin.options import Options, add_options

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# What an environment variable can hold: any text but NUL and lone surrogates (os.environ refuses both).
ENV_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=30)


class _Table:
    """The options as ``add_options`` declares them: name -> its keyword arguments (type, action, choices, default)."""

    def __init__(self):
        self.options: dict[str, dict] = {}

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, name, **kwargs):
        self.options[name] = kwargs

    def addini(self, *args, **kwargs):
        pass


TABLE = _Table()
add_options(TABLE)
OPTIONS = TABLE.options

NUMBER_TEXT = st.one_of(st.sampled_from(["1", "1e308", "1e-300", "-0", "nan", "inf", "5%", "-5%", "1e400%", "0x10"]),
                        st.integers().map(str), st.floats().map(repr))
# Text of each option's own grammar, beside arbitrary text: a gate spec, a GPU spec, a -k expression, a fraction.
GRAMMARS = {
    "--trainbench-compare-fail": st.lists(st.tuples(st.sampled_from([*METRICS, "deterministic", "bogus", ""]),
                                                    NUMBER_TEXT), max_size=3).map(
        lambda pairs: ",".join(f"{m}:{t}" for m, t in pairs)),
    "--trainbench-simulate-gpu": st.one_of(
        st.sampled_from([*FLEET, *(g.name for g in FLEET.values()), "3xl4", "0xl4", "99999999999xh100-sxm"]),
        st.fixed_dictionaries({"name": st.sampled_from(["X 1", "X 1", "", "A,B"]), "memory_gib": NUMBER_TEXT,
                               "capability": st.sampled_from(["8.9", "9.0", "10.0", "8.0", "8", "x.y", "8.10"]),
                               "sms": st.sampled_from(["132", "1e308", "0"]) | NUMBER_TEXT},
                              optional={"count": NUMBER_TEXT, "bf16": st.sampled_from(["1", "0", "maybe"]),
                                        "bandwidth_gbs": NUMBER_TEXT, "tflops_bf16": NUMBER_TEXT}).map(
            lambda spec: ",".join(f"{k}={v}" for k, v in spec.items()))),
    "--trainbench-inject-slowdown": NUMBER_TEXT,
    "--trainbench-profile-trace-cases": st.text("ab ()andornot-_[]\\'\"", max_size=20),
    "--trainbench-ab": st.sampled_from([sys.executable, "/nonexistent/python", "/etc/passwd", "python3", ".", ""]),
    "--trainbench-ab-base": st.sampled_from([sys.executable, "/nonexistent/python", "/etc", "python3"]),
}


def _drawn(name: str, spec: dict):
    """Values pytest's parser can hand ``name`` over: its type's, or its default where it was not given."""
    default = st.just(spec.get("default"))
    if spec.get("action") == "store_true":
        return st.booleans()
    if "choices" in spec:
        return st.sampled_from(spec["choices"])
    if spec.get("type") is int:
        return default | st.integers()
    if spec.get("type") is float:
        return default | st.floats()
    return default | st.text(max_size=40) | GRAMMARS.get(name, st.nothing())


class _Config:
    """The part of pytest's config ``Options.from_config`` reads."""

    def __init__(self, values: dict, ini: str, rootpath: Path):
        self.values, self.ini, self.rootpath = values, ini, rootpath

    def getoption(self, name, default=None):
        return self.values.get(name, default)

    def getini(self, name):
        return self.ini


def _config(draw, rootpath: Path) -> _Config:
    """A few options given (any values of their types), the others at their defaults: so that each option's own check
    is reached as often as the refusals of options read before it."""
    given = draw(st.sets(st.sampled_from(sorted(OPTIONS)), max_size=4), label="given")
    values = {name: draw(_drawn(name, spec), label=name) if name in given else spec.get("default")
              for name, spec in OPTIONS.items()}
    for name in ("benchmark_save", "benchmark_autosave", "benchmark_compare"):  # pytest-benchmark's, read beside them
        values[name] = draw(st.sampled_from([None, None, None, False, "", "0001", "*_baseline", True]), label=name)
    values["benchmark_disable"] = draw(st.booleans())
    return _Config(values, draw(st.sampled_from(["", "benchmarks/budgets.toml"])), rootpath)


def _one_line_refusal(error: BaseException) -> None:
    assert "\n" not in str(error) and str(error).startswith("trainbench: "), repr(str(error))


def _as_documented(options: Options) -> None:
    """Every field of a read ``Options`` holds a value of its documented type and range."""
    settings_ = options.settings_overrides
    assert all(settings_[k] is None or (type(settings_[k]) is int and settings_[k] >= 1)
               for k in ("rounds", "steps_per_round", "min_warmup_steps"))
    assert settings_["no_progress_s"] is None or 0 <= settings_["no_progress_s"] < math.inf
    assert 0 < options.compare_alpha < 1 and 0 <= options.remeasure_s < math.inf
    assert options.profile_name in OPTIONS["--trainbench-profile"]["choices"]
    if options.compare_fail is not None:  # never an empty gate
        assert options.compare_fail and all(m in METRICS and 0 <= t < math.inf for m, t in options.compare_fail.items())
    if options.fault is not None:
        assert 0 <= options.fault.slowdown < math.inf and 0 <= options.fault.leak_mib < math.inf
        assert options.fault.slowdown or options.fault.leak_mib
    if options.ab is not None:
        assert options.ab.pairs >= 3 and options.ab.head_python and options.ab.base_python
    if options.simulate_gpu is not None:
        gpu = options.simulate_gpu
        assert isinstance(gpu, Gpu) and gpu.memory_bytes > 0 and gpu.multiprocessors > 0 and gpu.count >= 1
        assert all(0 < v < math.inf for _, v in gpu.peaks) and (gpu.bandwidth_gbs is None or 0 < gpu.bandwidth_gbs < math.inf)
    assert options.budgets_override is None or isinstance(options.budgets_override, Path)


@FAST
@given(data=st.data())
def test_any_option_values_read_as_documented_or_are_refused_in_one_line(data, tmp_path_factory):
    switches = {name: data.draw(st.none() | st.sampled_from(["1", "0", "on", "no", ""]) | ENV_TEXT, label=name)
                for name in SWITCHES}
    config = _config(data.draw, tmp_path_factory.getbasetemp())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRAINBENCH_")}
    environ.update({name: value for name, value in switches.items() if value is not None})
    with mock.patch.dict(os.environ, environ, clear=True):
        try:
            options = Options.from_config(config)
        except pytest.UsageError as e:
            _one_line_refusal(e)
            event("refused")
        else:
            _as_documented(options)
            event("read")


@FAST
@given(spec=st.text(max_size=12) | st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:x", "cuda:99999999999999999999",
                                                   "cpu:0", "meta", "CPU", " cpu", "x\ny", "cpu\0"]))
def test_any_device_option_is_a_device_here_or_refused_in_one_line(spec, tmp_path_factory):
    from trainbench.devices.device import Backend
    from trainbench.plugin.session import TrainbenchSession

    defaults = {name: opt.get("default") for name, opt in OPTIONS.items()}
    options = Options.from_config(_Config({**defaults, "--trainbench-device": spec}, "", tmp_path_factory.getbasetemp()))
    session = TrainbenchSession(options)
    try:
        session.check_device()
    except pytest.UsageError as e:
        _one_line_refusal(e)
        assert str(e).startswith(f"trainbench: --trainbench-device={spec if spec.isprintable() else repr(spec)}: ")
    else:
        assert spec in ("", "auto") or isinstance(session.machine.backend, Backend)


DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
VALUES = st.one_of(ENV_TEXT, st.text(max_size=20), NUMBER_TEXT, st.sampled_from(["1", "0", "true", "off", "cuda:0",
                                                                                "cuda:-1", "cuda:1x", "gpu", "(", "[a",
                                                                                "a{99999999999}", "\0", "x\0y"]))


@FAST
@given(name=st.sampled_from(sorted(ENVIRONMENT)), value=st.none() | VALUES)
def test_any_value_of_a_trainbench_variable_reads_as_documented_or_is_refused_in_one_line(name, value):
    variable = ENVIRONMENT[name]
    try:
        read = env_value(name, {} if value is None else {name: value})
    except EnvError as e:
        assert "\n" not in str(e) and str(e).startswith(f"{name}={value!r}: "), repr(str(e))
        assert value is not None and value.strip()  # unset or blank is always the default
        return
    if value is None or not value.strip():
        assert read == variable.default
    elif variable.kind == "switch":
        assert type(read) is bool
    elif variable.kind == "seconds":
        assert type(read) is float and 0 < read < math.inf
    elif variable.kind == "device":
        assert DEVICE.fullmatch(read)
    elif variable.kind == "pattern":
        assert re.compile(read) is not None
    else:
        assert variable.kind == "path" and "\0" not in read


def test_the_environment_table_names_each_kind_a_reader_knows():
    assert {v.kind for v in ENVIRONMENT.values()} <= {"switch", "seconds", "device", "pattern", "path"}
    assert all(name.startswith("TRAINBENCH_") and set(name) <= set(string.ascii_uppercase + "_") for name in ENVIRONMENT)


NAME = st.text(st.characters(blacklist_characters="/"), min_size=1, max_size=20)  # one path component: stays in a tmp dir


@FAST
@given(name=NAME, as_file=st.booleans())
def test_any_output_or_budgets_path_is_taken_or_refused_in_one_line(name, as_file, tmp_path_factory):
    from trainbench.core.records.budgets import BudgetError, Budgets
    from trainbench.plugin.startup import check_output_files

    folder = tmp_path_factory.mktemp("out")
    path = folder / name / "out.json" if as_file else folder / name
    try:
        check_output_files([("--trainbench-compare-json", path)])
    except pytest.UsageError as e:
        _one_line_refusal(e)
    try:
        Budgets.load(path)
    except BudgetError as e:
        assert "\n" not in str(e), repr(str(e))


def test_what_the_properties_found_is_refused_in_one_line(tmp_path):
    # an A/B Python, a device, a budgets file holding a newline; a NUL in a path
    for option, value in (("--trainbench-ab", "\n"), ("--trainbench-ab-base", "a\nb")):
        defaults = {name: opt.get("default") for name, opt in OPTIONS.items()}
        with pytest.raises(pytest.UsageError) as raised:
            Options.from_config(_Config({**defaults, "--trainbench-ab": sys.executable, option: value}, "", tmp_path))
        assert str(raised.value).startswith(f"trainbench: {option}={value!r}: ") and "\n" not in str(raised.value)
    from trainbench.core.records.budgets import BudgetError, Budgets
    from trainbench.plugin.startup import check_output_files

    with pytest.raises(pytest.UsageError, match=r"^trainbench: --trainbench-compare-json: cannot write into "
                                                r"'.*\\x00' \(embedded null byte\); expected a writable folder$"):
        check_output_files([("--trainbench-compare-json", tmp_path / "a\0" / "v.json")])
    with pytest.raises(BudgetError, match=r"^'budgets\\ntoml': not a file path \(a control character in it\)"):
        Budgets.load("budgets\ntoml")
