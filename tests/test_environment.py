"""Which software versions a comparison names when they differ between the compared runs."""

from trainbench.devices.environment import ENVIRONMENT_KEYS, environment_differences

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


# -- installed packages -------------------------------------------------------------------------

def _distribution(folder, name: str, version: str):
    """A distribution as pip leaves one: ``<name>-<version>.dist-info/METADATA`` in a folder on the path."""
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_installed_packages_are_every_distribution_on_the_path_by_canonical_name(tmp_path, monkeypatch):
    from importlib.metadata import version

    from trainbench.devices.environment import installed_packages

    before = installed_packages()
    assert before["torch"] == version("torch") and before["pytest"] == version("pytest")
    monkeypatch.syspath_prepend(str(_distribution(tmp_path, "Fake_Pkg.Extra", "1.0")))
    after = installed_packages()
    assert {n: v for n, v in after.items() if n not in before} == {"fake-pkg-extra": "1.0"}
    assert list(after) == sorted(after)


def test_the_first_of_two_installs_of_a_package_is_the_one_recorded(tmp_path, monkeypatch):
    from trainbench.devices.environment import installed_packages

    # first on the path: what ``import`` finds
    monkeypatch.syspath_prepend(str(_distribution(tmp_path / "later", "fakepkg", "1.0")))
    monkeypatch.syspath_prepend(str(_distribution(tmp_path / "first", "fakepkg", "2.0")))
    assert installed_packages()["fakepkg"] == "2.0"


def test_package_differences_name_changed_versions_then_packages_only_here_then_only_there():
    from trainbench.devices.environment import package_differences

    there = {"numpy": "2.0.1", "triton": "3.4.0", "pillow": "11.0", "six": "1.16"}
    here = {"numpy": "2.1.0", "triton": "3.5.0", "pillow": "11.0", "zipp": "3.20", "fakepkg": "1.0"}
    assert package_differences(there, here) == [
        "package numpy 2.0.1 there, 2.1.0 here", "package triton 3.4.0 there, 3.5.0 here",
        "package fakepkg only here (1.0)", "package zipp only here (3.20)", "package six only there (1.16)"]
    assert package_differences(here, dict(here)) == []
    assert package_differences(None, here) == [] and package_differences(there, None) == []  # a run saved before


def test_the_environment_names_the_devices_libraries_then_the_packages_and_torch_once():
    there = {**H100, "torch": "2.9.1+cu128"}
    differences = environment_differences(there, H100, {"torch": "2.9.1+cu128", "triton": "3.4.0"},
                                          {"torch": "2.14.1+cu130", "triton": "3.5.0"})
    assert differences == ["torch 2.9.1+cu128 there, 2.14.1+cu130 here", "package triton 3.4.0 there, 3.5.0 here"]
    # the packages alone, where the identities are the same (or not recorded)
    assert environment_differences(None, None, {"numpy": "2.0"}, {"numpy": "2.1"}) == ["package numpy 2.0 there, 2.1 here"]
    assert environment_differences(H100, H100, {"torch": "2.14.1"}, {"torch": "2.14.2"}) == [
        "package torch 2.14.1 there, 2.14.2 here"]
