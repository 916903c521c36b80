"""Memory predicted under FakeTensorMode (trainbench.core.analyses.predict): the same breakdown the measurement tracks, from fake
tensors, at sizes this machine need not hold; and the setups it cannot fake, said with a reason instead of a crash."""

import contextlib
import dataclasses
import functools

import pytest
import torch
from torch import nn

from trainbench.core.method.measure import Measurer, MeasureSettings
from trainbench.core.analyses.predict import (
    PredictionCache,
    allocator_peak_bounds,
    cublas_workspace_bytes,
    library_workspace_bytes,
    memory_setup,
    optimizer_path_of_real_tensors,
    predict_memory,
    unpredictable,
)
from trainbench.core.setups.recipes import get_recipe, without_unpredictable
from trainbench.core.method.runner import Runner
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.training import TrainingSetup
from trainbench.core.setups.workloads import PROFILES, resolve_spec

MIB = 2**20


def _measured_breakdown(config, spec, backend, steps=3):
    """The tracked breakdown as the runner measures it: after real steps (gradients and optimizer state exist)."""
    with TrainingSetup(config, spec, backend) as training:
        measurement = Measurer(training, "measured", "measured", MeasureSettings(), 0, "cpu")
        for _ in range(steps):
            measurement.timed_step()
        return measurement.tracked_breakdown()


@pytest.mark.parametrize(("workload", "recipe"), [
    ("resnet18", "baseline"),
    ("resnet18", "set_to_none"),
    ("resnet18", "checkpointing"),
    ("resnet18", "uint8_transfer"),
    ("gpt", "baseline"),  # tied embedding and LM head, AdamW
    ("transformer", "grad_accumulation"),
    ("mlp", "eval_no_grad"),
])
def test_the_prediction_is_the_measured_breakdown(workload, recipe, cpu, profile):
    config, spec = get_recipe(recipe).config(profile), resolve_spec(workload, profile)
    predicted = predict_memory(config, spec, cpu)
    assert predicted.keys() == {"device", "batch_size", "breakdown_bytes"}, predicted.get("reason")
    assert predicted["device"] == "cpu" and predicted["batch_size"] == config.step_batch_size(spec)
    measured = _measured_breakdown(config, spec, cpu)
    assert measured["total"] > 0 and measured["params"] > 0
    assert predicted["breakdown_bytes"] == measured


@pytest.mark.parametrize(("recipe", "why"), [
    ("compile", "compiled code"),
    ("fuse_pointwise_script", "compiled code"),
    ("fuse_pointwise_compile", "compiled code"),
    ("anomaly_detection", "anomaly mode"),
    ("profiler_left_on", "the profiler"),
    ("ddp_gloo", "data parallelism"),
    ("data_parallel", "data parallelism"),
])
def test_a_setup_fake_tensors_cannot_run_is_not_predicted_but_said_why(recipe, why, cpu, profile, mlp, monkeypatch):
    monkeypatch.setattr(TrainingSetup, "__init__", lambda *a, **k: pytest.fail("built a setup it cannot predict"))
    config = get_recipe(recipe).config(profile)
    assert unpredictable(config).startswith(why)
    assert predict_memory(config, mlp, cpu) == {"reason": unpredictable(config)}


@pytest.mark.parametrize("recipe", ["compile", "fuse_pointwise_script", "anomaly_detection", "profiler_left_on",
                                    "ddp_gloo", "data_parallel"])
def test_without_unpredictable_keeps_the_rest_of_the_setup(recipe, profile):
    config = get_recipe(recipe).config(profile)
    nearest = without_unpredictable(config).validate()
    assert unpredictable(nearest) is None
    assert (nearest.compile, nearest.fuse_pointwise, nearest.parallel, nearest.debug) == (False, None, None, None)
    assert (nearest.world_size, nearest.replicas, nearest.dist_backend) == (1, 1, None)
    assert nearest.step_batch_size(resolve_spec("mlp", profile)) == config.step_batch_size(resolve_spec("mlp", profile))


def test_without_unpredictable_keeps_knobs_fake_tensors_can_run(profile):
    for recipe in ("baseline", "amp_bf16", "checkpointing", "emit_nvtx", "larger_batch"):
        config = get_recipe(recipe).config(profile)
        assert unpredictable(config) is None and without_unpredictable(config) == config


def _branching_loss(model, batch):
    loss = classification_loss(model, batch)
    if loss > 0:  # a question about the data: fake tensors have none
        return loss
    return -loss


def _random_features(batch_size, gen):
    return (torch.randn(batch_size, 8, generator=gen, device=gen.device),
            torch.randint(0, 2, (batch_size,), generator=gen, device=gen.device))


BRANCHING = TrainingSpec(name="branching", model=lambda: nn.Linear(8, 2), loss_fn=_branching_loss,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.01), batch_size=4, batches=_random_features)


def test_a_step_that_asks_the_data_a_question_is_not_predicted_but_said_why(cpu, profile):
    prediction = predict_memory(get_recipe("baseline").config(profile), BRANCHING, cpu)
    assert list(prediction) == ["reason"]
    assert prediction["reason"].startswith("FakeTensorMode could not run the step: ")
    assert "data-dependent" in prediction["reason"]
    # the same setup trains for real
    assert _measured_breakdown(get_recipe("baseline").config(profile), BRANCHING, cpu, steps=1)["total"] > 0


def test_the_runner_records_the_gpu_profiles_prediction_and_checks_the_method_on_the_run(cpu, profile, quick):
    outcome = Runner(cpu, profile, quick, predict=True).run("baseline", "mlp")
    predicted = outcome.result.predicted_memory
    assert predicted["profile"] == "gpu" and predicted["device"] == "cpu"
    gpu = PROFILES["gpu"]
    assert predicted["batch_size"] == gpu.batch_size
    # the same MLP on both profiles: its parameters, gradients and SGD momentum are shape-determined
    param_bytes = 4 * sum(p.numel() for p in resolve_spec("mlp", gpu).model().parameters())
    breakdown = predicted["breakdown_bytes"]
    assert breakdown["params"] == breakdown["grads"] == breakdown["optimizer_state"] == param_bytes
    assert breakdown["total"] == sum(v for k, v in breakdown.items() if k != "total")  # the split of one peak
    # the check: the prediction of the setup just measured (CPU profile) against what was measured
    check = predicted["check"]
    assert check["profile"] == "cpu" and check["matches"] is True and check["differences"] == {}
    assert check["predicted_total"] == check["measured_total"] == outcome.result.memory_breakdown_bytes["total"]
    assert outcome.result.metrics()["predicted_gpu_peak_mib"] == breakdown["total"] / MIB
    assert outcome.record()["predicted_gpu_peak_mib"] == breakdown["total"] / MIB > 0
    assert outcome.record()["predicted_memory"] == predicted
    assert "predict" in outcome.result.phase_seconds


def test_a_runner_told_not_to_predict_records_no_prediction(cpu, profile, quick):
    outcome = Runner(cpu, profile, quick, predict=False).run("baseline", "mlp")
    assert outcome.result.predicted_memory is None and outcome.record()["predicted_gpu_peak_mib"] is None


def test_the_gpu_profile_predicts_more_activations_in_proportion_to_its_inputs(cpu):
    cpu_profile, gpu = PROFILES["cpu"], PROFILES["gpu"]
    small, large = (predict_memory(get_recipe("baseline").config(p), resolve_spec("resnet18", p), cpu)["breakdown_bytes"]
                    for p in (cpu_profile, gpu))
    for same_model in ("params", "grads", "optimizer_state", "buffers"):
        assert large[same_model] == small[same_model]
    assert large["total"] > small["total"]
    # 32 images of 224 px against 16 of 64 px: the inputs, and every activation with them, grow ~24.5x
    input_ratio = (gpu.batch_size * gpu.image_size**2) / (cpu_profile.batch_size * cpu_profile.image_size**2)
    assert input_ratio > 5
    assert 0.8 * input_ratio < large["activations"] / small["activations"] <= 1.05 * input_ratio


MIB = 2**20


def test_cublas_workspace_is_torchs_default_for_the_gpu_or_what_cublas_workspace_config_asks():
    assert cublas_workspace_bytes((9, 0), None) == 32 * MIB  # Hopper: :4096:8
    assert cublas_workspace_bytes((8, 0), None) == 8 * MIB + 128 * 1024  # :4096:2:16:8
    assert cublas_workspace_bytes((10, 0), None) == 8 * MIB + 128 * 1024  # torch tests sm_90 exactly
    assert cublas_workspace_bytes((8, 0), ":4096:8") == 32 * MIB
    assert cublas_workspace_bytes((9, 0), ":16:8") == 128 * 1024
    assert cublas_workspace_bytes((9, 0), "garbled") == 32 * MIB  # torch falls back to its default


def test_the_allocator_peak_may_exceed_the_prediction_by_ten_percent_and_two_handles_workspaces():
    # Two cuBLAS handles (the training thread, autograd's backward thread), each with a cuBLASLt MiB.
    assert library_workspace_bytes((9, 0), None) == 2 * (32 + 1) * MIB
    predicted = 81 * MIB
    low, high = allocator_peak_bounds(predicted, (9, 0), None)
    assert low == int(0.9 * predicted) and high == int(1.1 * predicted) + 66 * MIB
    # ResNet-18's ~32 MiB of Hopper workspace alone breaks a bare 10% bound of an 81 MiB peak; not this one.
    measured = predicted + 32 * MIB
    assert not measured <= 1.1 * predicted and low <= measured <= high
    assert allocator_peak_bounds(predicted, (7, 5), None)[1] == int(1.1 * predicted) + int(2 * (8.125 + 1) * MIB)


def _fake_model_and_adamw(device: str):
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256, device=device) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # a backward on fake cuda tensors needs a CUDA device; the step does not
    optimizer.step()  # its state exists before the tracked step, as in a prediction
    return model, optimizer


@pytest.mark.parametrize(("device", "foreach"), [("cuda", True), ("cpu", False)])
def test_a_predicted_optimizer_takes_the_path_torch_takes_for_real_tensors_on_the_device(device, foreach):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.optim.optimizer import _default_to_fused_or_foreach

    with FakeTensorMode(allow_non_fake_inputs=True):
        params = list(_fake_model_and_adamw(device)[0].parameters())
        assert _default_to_fused_or_foreach(params, differentiable=False) == (False, False)  # fake: never foreach
        with optimizer_path_of_real_tensors():
            assert _default_to_fused_or_foreach(params, differentiable=False) == (False, foreach)
        assert _default_to_fused_or_foreach(params, differentiable=False) == (False, False)  # restored


def test_a_predicted_cuda_optimizer_step_holds_the_foreach_temporary():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    def step_peak(path) -> int:
        with FakeTensorMode(allow_non_fake_inputs=True), path():
            model, optimizer = _fake_model_and_adamw("cuda")
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            with tracker:
                optimizer.step()
            return tracker.get_tracker_snapshot("peak")[torch.device("cuda", 0)]["Total"]

    largest_parameter = 256 * 256 * 4
    # foreach computes each update over all parameters at once: a temporary beyond the loop's one-parameter ones
    assert step_peak(optimizer_path_of_real_tensors) - step_peak(contextlib.nullcontext) > largest_parameter


# -- models and data that fake tensors did not take as users give them ---------------------------------------------

class _Image(torch.Tensor):
    """A tensor subclass as transforms return them (torchvision's ``v2.ToImage()`` gives ``tv_tensors.Image``)."""


class _SubclassImages(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(3, 8, 8).as_subclass(_Image), i % 2


class _DropRatesNet(nn.Module):
    """A constructor that computes a constant from tensors, as timm's ``calculate_drop_path_rates`` does
    (``[x.item() for x in torch.linspace(0, rate, depth)]``): fake tensors have no value to give."""

    builds = 0

    def __init__(self):
        super().__init__()
        type(self).builds += 1
        rates = [x.item() for x in torch.linspace(0, 0.2, 3)]
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Dropout(rate)) for rate in rates])
        self.tied = nn.Linear(8, 8)
        self.tied.weight = self.blocks[0][0].weight  # one parameter in two places: faked once, counted once
        self.head = nn.Linear(8, 2)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return self.head(self.tied(self.blocks(x.flatten(1)[:, :8] * self.scale)))


def _spec(name, model, **data):
    return TrainingSpec(name=name, model=model, loss_fn=classification_loss,
                        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), batch_size=4,
                        **(data or {"batches": _random_features}))


def test_a_batch_of_tensor_subclasses_is_predicted_as_the_loader_collates_it(cpu, profile):
    spec = _spec("subclass_images", lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2)),
                 dataset=_SubclassImages)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.data import default_collate

    image = _SubclassImages()[0][0]
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(TypeError, match="Multiple dispatch failed"):
        default_collate([image] * 2)  # what the prediction ran into: aten.stack refuses a subclass it does not know
    config = get_recipe("baseline").config(profile)
    predicted = predict_memory(config, spec, cpu)
    assert "breakdown_bytes" in predicted, predicted.get("reason")
    assert predicted["breakdown_bytes"] == _measured_breakdown(config, spec, cpu)


def test_a_model_whose_constructor_asks_a_tensor_its_value_is_built_for_real_then_faked(cpu, profile):
    config = get_recipe("baseline").config(profile)
    spec = _spec("drop_rates", _DropRatesNet)
    _DropRatesNet.builds = 0
    predicted = predict_memory(config, spec, cpu)
    assert "breakdown_bytes" in predicted, predicted.get("reason")
    assert _DropRatesNet.builds == 2  # under fake tensors (which failed), then for real
    assert predicted["breakdown_bytes"] == _measured_breakdown(config, spec, cpu)


def test_a_model_fake_tensors_can_build_is_built_once_and_never_for_real(cpu, profile, monkeypatch):
    from trainbench.core.analyses import predict

    builds = []
    monkeypatch.setattr(predict, "_made_fake", lambda *a: pytest.fail("a fake-buildable model was built for real"))
    spec = _spec("linear", lambda: builds.append(1) or nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
    assert "breakdown_bytes" in predict_memory(get_recipe("baseline").config(profile), spec, cpu)
    assert len(builds) == 1


def test_a_model_that_cannot_be_built_at_all_says_its_own_error(cpu, profile):
    def broken():
        raise ValueError("no such block: blokc")

    prediction = predict_memory(get_recipe("baseline").config(profile), _spec("broken", broken), cpu)
    assert list(prediction) == ["reason"]
    assert "ValueError: no such block: blokc (at " in prediction["reason"]


class _Texts(torch.utils.data.Dataset):
    """Token sequences of random lengths, drawn in the constructor from tensors (``int(n)``): a question a dataset
    built under fake tensors cannot answer."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.texts = [torch.randint(1, 50, (int(n),), generator=gen) for n in torch.randint(2, 9, (16,), generator=gen)]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return {"input_ids": self.texts[i]}


def _pad(samples):
    """A collator's right padding to 8 tokens, with the mask the loss needs (no such key without it)."""
    ids = torch.zeros(len(samples), 8, dtype=torch.long)
    for row, sample in zip(ids, samples):
        row[:len(sample["input_ids"])] = sample["input_ids"]
    return {"input_ids": ids, "mask": (ids != 0).float()}


def _masked_loss(model, batch):
    per_token = model(batch["input_ids"]).logsumexp(-1)
    return (per_token * batch["mask"]).sum() / batch["mask"].sum()


def test_a_dataset_that_asks_its_tensors_in_its_constructor_and_a_padding_collate_fn_are_predicted(cpu, profile):
    spec = TrainingSpec(name="padded", model=lambda: nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)),
                        loss_fn=_masked_loss, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), batch_size=4,
                        dataset=_Texts, collate_fn=_pad)
    config = get_recipe("baseline").config(profile)
    predicted = predict_memory(config, spec, cpu)
    assert "breakdown_bytes" in predicted, predicted.get("reason")
    assert predicted["breakdown_bytes"] == _measured_breakdown(config, spec, cpu)


def test_a_timm_vit_on_tv_tensor_images_is_predicted_as_measured(cpu, profile):
    timm = pytest.importorskip("timm")
    v2 = pytest.importorskip("torchvision.transforms.v2")

    class Images(torch.utils.data.Dataset):  # uint8 CHW images as tv_tensors.Image: the uint8 path
        def __init__(self, pixels=None):
            self.pixels = pixels

        def __len__(self):
            return 8

        def __getitem__(self, i):
            image = v2.ToImage()(torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8).numpy())
            return (image if self.pixels else v2.ToDtype(torch.float32, scale=True)(image)), i % 10

    # A ViT: its constructor takes the drop-path rates from torch.linspace(...).item(), as ConvNeXt's does.
    spec = TrainingSpec(name="timm_vit", model=functools.partial(timm.create_model, "vit_tiny_patch16_224",
                                                                 pretrained=False, num_classes=10, img_size=32, depth=2),
                        loss_fn=classification_loss, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
                        batch_size=4, dataset=Images, pixels=("uint8",))
    config = get_recipe("uint8_transfer").config(profile)
    predicted = predict_memory(config, spec, cpu)
    assert "breakdown_bytes" in predicted, predicted.get("reason")
    assert predicted["breakdown_bytes"] == _measured_breakdown(config, spec, cpu, steps=1)


# -- one prediction per memory setup ---------------------------------------------------------------------------------

def test_setups_that_share_a_memory_setup_measure_the_same_breakdown(cpu, profile):
    """The evidence for ``memory_setup``: setups it maps together hold the same tensors when measured for real. Knobs
    that change which tensors live (gradients set to None, a loss summed on the device between syncs) keep theirs."""
    base, spec = get_recipe("baseline").config(profile), resolve_spec("mlp", profile)
    same = [dataclasses.replace(base, num_workers=1, non_blocking=True),
            dataclasses.replace(base, cudnn_benchmark=True, empty_cache=True),
            get_recipe("loss_item").config(profile)]
    measured = _measured_breakdown(base, spec, cpu)
    for config in same:
        assert config != base and memory_setup(config) == memory_setup(base)
        assert _measured_breakdown(config, spec, cpu) == measured, config
    for config in (get_recipe("set_to_none").config(profile), dataclasses.replace(base, loss_history="item", log_every=2)):
        assert memory_setup(config) != memory_setup(base)


def test_the_cache_predicts_once_per_memory_setup_and_spec(cpu, profile, monkeypatch):
    from trainbench.core.analyses import predict

    made = []
    monkeypatch.setattr(predict, "predict_memory",
                        lambda config, spec, backend: made.append((config, spec.name)) or {"reason": f"#{len(made)}"})
    cache, spec = PredictionCache(cpu), resolve_spec("mlp", profile)
    shared = [cache("cpu", get_recipe(r).config(profile), spec)
              for r in ("baseline", "multiprocess_loading", "pinned_memory", "cudnn_benchmark", "loss_item", "empty_cache")]
    assert made == [(memory_setup(get_recipe("baseline").config(profile)), "mlp")]  # predicted as its memory setup
    assert all(p is shared[0] for p in shared)
    assert cache("cpu", get_recipe("set_to_none").config(profile), spec) == {"reason": "#2"}
    # The same spec object asked for under another profile with the same setup: the same tensors, no new prediction.
    assert cache("gpu", get_recipe("baseline").config(profile), spec) is shared[0] and len(made) == 2
    # A workload built for the GPU profile is another spec (its sizes), and is predicted.
    assert cache("gpu", get_recipe("baseline").config(profile), resolve_spec("mlp", PROFILES["gpu"])) == {"reason": "#3"}
    # ...once: its name and profile find it again, whichever object the workload was rebuilt as.
    assert cache("gpu", get_recipe("baseline").config(profile), resolve_spec("mlp", PROFILES["gpu"])) == {"reason": "#3"}
    assert len(made) == 3


def test_a_prediction_leaves_memtracker_as_it_found_it(cpu, profile, mlp):
    from torch.distributed._tools.mem_tracker import MemTracker

    update = MemTracker._update_peak_stats
    assert "breakdown_bytes" in predict_memory(get_recipe("baseline").config(profile), mlp, cpu)
    assert "reason" in predict_memory(get_recipe("baseline").config(profile), BRANCHING, cpu)  # raised inside
    assert MemTracker._update_peak_stats is update


# -- a prediction that cannot be made says why in the summary -------------------------------------------------------

def test_the_summary_gives_the_reason_a_case_was_not_predicted(cpu, profile, quick):
    from trainbench.core.records.result import CaseRecord
    from trainbench.plugin.summary import _prediction_lines
    from trainbench.verdicts.present import summary_table

    records = [CaseRecord.read(Runner(cpu, profile, quick, predict=True).run("baseline", spec).record(), "case")
               for spec in ("mlp", BRANCHING)]
    reason = records[1].prediction_failure
    assert reason.startswith("FakeTensorMode could not run the step: ") and "data-dependent" in reason
    assert records[0].prediction_failure is None and records[0].prediction_matches is True
    rows = summary_table(records)[2:]
    assert rows[0].split()[6].isdigit() and rows[1].split()[6] == "n/a"  # the GPU pred column
    lines = _prediction_lines(records)
    assert lines[1] == (f"GPU pred n/a for {records[1].case}: {reason}", True)
    # the method's check ran on the one case predicted, and no more is claimed
    assert lines[0][0].endswith("; each case's own setup predicted exactly as measured") and len(lines) == 2


def test_a_model_that_deep_copies_its_layers_is_predicted_without_torchs_fake_data_pointer_warning(cpu, profile):
    # nn.TransformerEncoder clones its layer with copy.deepcopy, which asks each fake parameter for a data pointer.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predicted = predict_memory(get_recipe("baseline").config(profile), resolve_spec("transformer", profile), cpu)
    assert "breakdown_bytes" in predicted, predicted.get("reason")
    assert not [w for w in caught if "data pointer" in str(w.message)]
