"""The device module: what a GPU is said to offer (checked with torch.cuda replaced, so it runs on CPUs)."""


def test_a_gpu_supports_bf16_only_natively(monkeypatch):
    from trainbench import device

    asked = {}

    def is_bf16_supported(including_emulation=True):
        asked["including_emulation"] = including_emulation
        return including_emulation  # a V100: bf16 only by emulation

    monkeypatch.setattr(device.torch.cuda, "is_bf16_supported", is_bf16_supported)
    backend = object.__new__(device.CudaBackend)
    assert backend.supports_bf16() is False and asked == {"including_emulation": False}
