"""The built-in workloads: specs like any user's, sized by the device profile, on seeded synthetic data."""

import pytest
import torch

from trainbench.core.setups.spec import SpecError, TrainingSpec
from trainbench.core.setups.workloads import GPT, PROFILES, WORKLOADS, FakeCIFAR, FakeText, FakeTokens, image_transform, resolve_spec


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workload_trains_on_its_own_synthetic_batches_on_the_cpu_profile(name):
    spec = resolve_spec(name, PROFILES["cpu"])
    assert spec.name == name and spec.description
    torch.manual_seed(0)
    model = spec.model()
    batch = spec.batches(2, torch.Generator().manual_seed(0))
    loss = spec.loss_fn(model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    for block in spec.checkpoint_blocks:  # what the checkpointing recipe recomputes exists in the model
        model.get_submodule(block)


def _image_shape(spec):
    images, _ = spec.batches(1, torch.Generator().manual_seed(0))
    return images.shape


def test_the_profiles_size_the_same_workload_for_two_cores_or_for_a_gpu():
    cpu, gpu = resolve_spec("resnet18", PROFILES["cpu"]), resolve_spec("resnet18", PROFILES["gpu"])
    assert (cpu.batch_size, gpu.batch_size) == (PROFILES["cpu"].batch_size, PROFILES["gpu"].batch_size) == (16, 32)
    assert _image_shape(cpu) == (1, 3, 64, 64) and _image_shape(gpu) == (1, 3, 224, 224)
    assert PROFILES["cpu"].compute_data is None and PROFILES["gpu"].compute_data == "device"


def test_a_spec_comes_from_a_spec_a_workload_name_or_a_function_of_the_profile(mlp, profile):
    assert resolve_spec(mlp, profile) is mlp
    assert resolve_spec(lambda p: mlp, profile) is mlp
    with pytest.raises(SpecError, match="unknown workload 'resnet50': expected a TrainingSpec or one of"):
        resolve_spec("resnet50", profile)
    with pytest.raises(SpecError, match="returned int, expected a TrainingSpec"):
        resolve_spec(lambda p: 3, profile)
    with pytest.raises(SpecError, match="expected a TrainingSpec, a workload name or a function of the profile"):
        resolve_spec(3, profile)
    assert isinstance(resolve_spec("mlp", profile), TrainingSpec)


def test_fake_datasets_are_seeded_the_same_bytes_every_time():
    a, b, other = FakeCIFAR(8, seed=0), FakeCIFAR(8, seed=0), FakeCIFAR(8, seed=1)
    assert (a.data == b.data).all() and a.targets == b.targets and not (a.data == other.data).all()
    image, label = a[3]
    assert image.size == (32, 32) and 0 <= label < 10  # a PIL image, as torchvision's CIFAR10 serves it
    tokens, target = FakeTokens(4, seq_len=6, vocab=50)[1]
    assert tokens.shape == (6,) and int(tokens.max()) < 50 and 0 <= int(target) < 10
    assert torch.equal(FakeTokens(4, 6, 50).tokens, FakeTokens(4, 6, 50).tokens)
    assert FakeText(4, seq_len=6, vocab=50)[0]["input_ids"].shape == (7,)  # the inputs and the next token


def test_image_pixels_are_served_as_normalized_floats_or_as_uint8_for_the_device():
    image, _ = FakeCIFAR(1)[0]
    as_float = image_transform(64)(image)
    assert as_float.dtype == torch.float32 and as_float.shape == (3, 64, 64)
    assert -1.0 <= float(as_float.min()) and float(as_float.max()) <= 1.0
    chw = image_transform(32, "uint8")(image)
    hwc = image_transform(32, "uint8_hwc")(image)
    assert chw.dtype == hwc.dtype == torch.uint8 and chw.shape == (3, 32, 32) and hwc.shape == (32, 32, 3)
    assert torch.equal(hwc.permute(2, 0, 1), chw)  # the same pixels, left in the image's own layout


def test_the_gpt_ties_its_language_model_head_to_the_token_embedding():
    model = GPT(vocab=64, d_model=16, layers=1, heads=2, seq_len=8)
    assert model.head.weight is model.tokens.weight
    logits = model(torch.randint(0, 64, (2, 8)))
    assert logits.shape == (2, 8, 64)
