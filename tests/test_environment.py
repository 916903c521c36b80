"""Which software versions a comparison names when they differ between the compared runs."""

from trainbench.environment import ENVIRONMENT_KEYS, environment_differences

H100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "torch": "2.14.1+cu130", "driver": "580.65.06",
        "cuda": "13.0", "cudnn": 92400, "cublas": "13.1.1.3", "nccl": "2.30.7", "cpu_threads": 16}


def test_the_same_software_differs_in_nothing():
    assert environment_differences(H100, dict(H100)) == []


def test_each_updated_library_is_named_with_both_versions_in_a_fixed_order():
    updated = {**H100, "cudnn": 92500, "driver": "590.10", "cpu_threads": 8}
    assert environment_differences(H100, updated) == ["driver 580.65.06 there, 590.10 here",
                                                      "cudnn 92400 there, 92500 here"]
    assert set(ENVIRONMENT_KEYS) >= {"torch", "driver", "cuda", "cudnn", "cublas", "nccl"}


def test_a_version_one_run_did_not_record_says_nothing():
    older = {key: value for key, value in H100.items() if key not in ("cublas", "nccl")}
    assert environment_differences(older, {**H100, "cublas": "13.2"}) == []
    assert environment_differences({**H100, "driver": None}, {**H100, "driver": "590.10"}) == []
    assert environment_differences(None, H100) == [] and environment_differences(H100, None) == []
