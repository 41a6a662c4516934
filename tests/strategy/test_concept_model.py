"""The update concepts' cost model on N GPUs (pure Python, no TensorFlow)."""

import doctest

import pytest

from tf_glp.strategy import concept_model
from tf_glp.strategy.concept_model import Machine, predict


def test_bytes_per_parameter_as_the_docstring_counts_them():
    # Unit bandwidths make the times equal to the bytes moved.
    machine = Machine(gpus=4, pcie_bytes_per_s=1, gpu_link_bytes_per_s=None, host_memory_bytes_per_s=1,
                      gpu_memory_bytes_per_s=1)
    costs = predict(1, machine, state_bytes_per_parameter=24)
    assert costs["host"].link == 8  # 4 bytes to the host, 4 back, per GPU (links in parallel)
    assert costs["host"].host == 3 * 4 * 4 + 24  # copies in, read by the sum, copies out; the state
    assert costs["replicas"].host == 3 * 4 * 4 + 4 and costs["replicas"].device_update == 28
    assert costs["all-reduce"].link == pytest.approx(2 * 3 / 4 * 4)  # ring over PCIe without NVLink
    assert costs["all-reduce"].host == 0 and costs["one GPU"].link == 0


def test_nvlink_favours_the_all_reduce_and_pcie_only_machines_the_chunked_host_update():
    large = 100_000_000
    nvlink = predict(large, Machine.h100_sxm(8))
    assert nvlink["all-reduce"].exposed_after_chunking < nvlink["host"].exposed_after_chunking
    assert nvlink["all-reduce"].total < nvlink["host"].total
    pcie = predict(large, Machine.pcie_workstation(4))
    # Without chunking the host's memory traffic costs more than the ring;
    # with it only the copy back stays exposed.
    assert pcie["host"].total > pcie["all-reduce"].total
    assert pcie["host"].exposed_after_chunking < pcie["all-reduce"].exposed_after_chunking


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="gpus must be at least 1, got 0"):
        Machine(0, 1, None, 1, 1)
    with pytest.raises(ValueError, match="parameters must be >= 0, got -1"):
        predict(-1, Machine.h100_sxm())


def test_the_docstring_examples_run():
    assert doctest.testmod(concept_model).failed == 0
