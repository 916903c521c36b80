"""The examples are users' own trainings: each runs as a test, with its own budgets, through the public API only."""

import re
import shutil
from pathlib import Path

import pytest
import torch

from trainbench.devices.device import CpuBackend

EXAMPLES = Path(__file__).parents[1] / "examples"
BF16 = CpuBackend(torch.device("cpu")).supports_bf16()


@pytest.mark.parametrize("example, passed, skipped, library", [
    ("language_model", 5 if BF16 else 4, 0 if BF16 else 1, None),  # amp_bf16 needs a CPU with bf16
    ("contrastive", 4, 0, None),
    ("regression", 3, 1, None),  # optimizer_fused: plain SGD built by a lambda takes no fused=
    ("lightning_module", 4 if BF16 else 3, 0 if BF16 else 1, "lightning.pytorch"),
    ("gan", 6 if BF16 else 5, 1 if BF16 else 2, None),  # grad_accumulation: a custom step's updates cannot be accumulated
    ("hf_causal_lm", 5 if BF16 else 4, 0 if BF16 else 1, "transformers"),
    ("timm_classifier", 4, 0, "timm"),
    ("packed_rnn", 3, 0, None),
    ("detection", 3, 0, None),
    ("sparse_recommender", 4, 1, None),  # optimizer_foreach: SparseAdam has no foreach/fused implementation
    ("compiled_model", 1, 1, None),  # compile: the model came compiled; --trainbench-slow runs it (Inductor)
    ("activation_offload", 2, 0, None),  # a recipe of the user's own, with a knob of its own and its guard
])
def test_example_runs_and_meets_its_budgets(pytester, example, passed, skipped, library, quick_options, monkeypatch):
    if library:
        pytest.importorskip(library)  # the example skips itself without it; here it would count no passes
    for path in (EXAMPLES / example).iterdir():
        if path.is_file():
            shutil.copy(path, pytester.path / path.name)
    compiled = example == "compiled_model"
    # Inductor in a process of its own: imported first inside a worker whose earlier tests left torch's compile
    # modules half imported, it fails to register its caches ("already registered in mega-cache artifact factory")
    # (and a crash of fake tensors entering compiled code, which could take a process down, fails this test alone)
    run = pytester.runpytest_subprocess if compiled else pytester.runpytest
    if compiled:  # the memory prediction on: a model the user compiled must never be run on fake tensors
        monkeypatch.setenv("TRAINBENCH_PREDICT_MEMORY", "1")
    result = run(*quick_options, *(("--trainbench-slow",) if compiled else ()), "-rs", "-W",
                 "error::trainbench.plugin.NoBudgetWarning")
    result.assert_outcomes(passed=passed, skipped=skipped)
    summary = result.stdout.str().split("trainbench summary", 1)[1]
    assert " none" not in summary and "FAIL" not in summary  # every measured case had its budget, and met it
    if compiled:
        out = result.stdout.str()
        assert "the spec's model came compiled (torch.compile): compiling it again changes nothing" in out
        assert ("GPU pred n/a for compiled_classifier-baseline: the spec's model came compiled (torch.compile): compiled "
                "code runs its own kernels, which fake tensors cannot enter") in out
        assert "FakeTensorMode could not run" not in out


@pytest.mark.parametrize("example", ["language_model", "contrastive", "regression", "lightning_module", "gan", "hf_causal_lm",
                                     "timm_classifier", "packed_rnn", "detection", "sparse_recommender",
                                     "compiled_model", "activation_offload"])
def test_example_is_short_and_uses_the_public_api_only(example):
    [test_file] = (EXAMPLES / example).glob("test_*.py")
    source = test_file.read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, flags=re.MULTILINE)
    assert [name for name in imports if name.startswith("trainbench")] == ["trainbench"]  # from trainbench import ...
    assert "monkeypatch" not in source
    spec_and_test = source[source.index("SPEC = "):]
    code = [line for line in spec_and_test.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 20, f"{test_file.name}: {len(code)} lines of spec and test"
    assert (EXAMPLES / example / "budgets.toml").is_file()
