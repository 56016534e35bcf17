"""The shipped gpu-info table and TF_PROVIDER_HARDWARE_METADATA overrides."""

from __future__ import annotations

import logging

import pytest

from tfusion.hypervisor.devices.gpu_info import GpuInfoTable, HardwareMetadataError, parse_hardware_metadata

# model names exactly as nvmlDeviceGetName reports them, with their dense fp16 tensor TFLOPS
NVML_NAMES = {
    "NVIDIA A100-SXM4-80GB": 312, "NVIDIA A100-SXM4-40GB": 312, "NVIDIA A100 80GB PCIe": 312,
    "NVIDIA A100-PCIE-40GB": 312, "NVIDIA A800-SXM4-80GB": 312, "NVIDIA A800 80GB PCIe": 312,
    "NVIDIA H100 80GB HBM3": 989, "NVIDIA H100 PCIe": 756, "NVIDIA H800": 989, "NVIDIA H800 PCIe": 756,
    "NVIDIA H200": 989, "NVIDIA B200": 2250, "NVIDIA L40S": 362, "NVIDIA L40": 181, "NVIDIA L4": 121,
    "NVIDIA A10": 125, "NVIDIA A30": 165, "Tesla T4": 65, "Tesla V100-SXM2-32GB": 125,
    "Tesla V100-PCIE-16GB": 112, "NVIDIA GeForce RTX 4090": 330, "NVIDIA GeForce RTX 3090": 71,
}


@pytest.mark.parametrize(("name", "tflops"), sorted(NVML_NAMES.items()))
def test_shipped_table_knows_nvml_names(name: str, tflops: float) -> None:
    assert GpuInfoTable().fp16_tflops(name) == tflops


def test_pcie_and_sxm_variants_differ_where_the_hardware_does() -> None:
    table = GpuInfoTable()
    assert table.fp16_tflops("NVIDIA H100 PCIe") < table.fp16_tflops("NVIDIA H100 80GB HBM3")
    assert table.find("NVIDIA H100 PCIe").model == "H100_PCIe_80G"  # type: ignore[union-attr]


def test_matching_is_case_insensitive_and_ignores_the_vendor_word() -> None:
    table = GpuInfoTable()
    assert table.fp16_tflops("a100-sxm4-80gb") == 312
    assert table.fp16_tflops("  NVIDIA   L40S ") == 362
    assert table.fp16_tflops("H100-SXM5-80GB") == 989  # an alias


def test_unknown_model_reports_zero_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    table = GpuInfoTable()
    with caplog.at_level(logging.WARNING):
        assert table.fp16_tflops("NVIDIA Imaginary X9000") == 0
        assert table.fp16_tflops("NVIDIA Imaginary X9000") == 0
    warnings = [r for r in caplog.records if "Imaginary X9000" in r.getMessage()]
    assert len(warnings) == 1
    assert "TF_PROVIDER_HARDWARE_METADATA" in warnings[0].getMessage()


def test_metadata_overrides_the_table_and_zero_means_no_override() -> None:
    table = GpuInfoTable.from_metadata(
        '[{"model": "A100_SXM_80G", "fullModelName": "NVIDIA A100-SXM4-80GB", "fp16TFlops": 300},'
        ' {"fullModelName": "NVIDIA L4", "fp16TFlops": 0},'
        ' {"model": "X9000", "fullModelName": "NVIDIA Imaginary X9000", "fp16TFlops": "42.5"}]')
    assert table.fp16_tflops("NVIDIA A100-SXM4-80GB") == 300
    assert table.fp16_tflops("NVIDIA L4") == 121
    assert table.fp16_tflops("NVIDIA Imaginary X9000") == 42.5
    assert table.fp16_tflops("X9000") == 42.5


@pytest.mark.parametrize(("text", "where"), [
    ("{not json", "not JSON"),
    ('{"model": "x"}', "expected a JSON list"),
    ('[{"fp16TFlops": 3}]', "TF_PROVIDER_HARDWARE_METADATA[0]: needs a string"),
    ('[{"model": "x", "fp16TFlops": "lots"}]', "TF_PROVIDER_HARDWARE_METADATA[0].fp16TFlops"),
    ('[{"model": "x", "fp16TFlops": -1}]', "must not be negative"),
])
def test_bad_metadata_names_the_place(text: str, where: str) -> None:
    with pytest.raises(HardwareMetadataError, match=where.replace("[", r"\[").replace("]", r"\]")):
        parse_hardware_metadata(text)


def test_empty_metadata_means_no_overrides() -> None:
    assert parse_hardware_metadata("") == ()
    assert parse_hardware_metadata("  ") == ()
