"""The update concepts on N GPUs, on paper: what each moves per step and how
long that takes, from a machine's link and memory bandwidths.

No GPU has run tf_glp yet. This model says what the first GPU measurement
should find, so that it only has to confirm (or correct) it; the concept
actually used is chosen by measurement, never by this model alone.

Per training step, P float32 parameters (4P bytes of gradients), N GPUs,
an optimizer that reads and writes S bytes of state per parameter (Adam:
parameter, two moments: S = 24, plus the 4 bytes of the gradient read).
Each registered concept says what it moves (concepts.py, `traffic`):

- "host" (ICPE 2018): every GPU copies its gradients to the host
  (4P bytes over its own PCIe link, the N links in parallel); the host sums
  the N copies inside the fused update, which reads and writes the state
  there; then every GPU receives the new weights (4P bytes each). Host
  memory carries N*4P (copies in) + N*4P (read by the sum) + S*P (state) +
  N*4P (copies out). PCIe per GPU: 8 bytes per parameter.
- "replicas": the same copies in and the host sum (N*4P + N*4P + 4P
  bytes of host memory); the sum goes back (4P per GPU); every GPU applies
  the update in its own memory ((S + 4)P bytes, at GPU memory speed).
- "all-reduce" (MirroredStrategy, NCCL ring): every GPU sends and receives
  2(N - 1)/N * 4P bytes over the GPU-GPU links (NVLink; over PCIe where
  there is none), then updates in its own memory. The host moves nothing.
- "one GPU" (not an update concept: the alternative of no replicas): the
  whole global batch on one GPU: no communication, the update in GPU
  memory, but N times one replica's compute (not modelled: the
  measurement compares it).

Chunking (cost_model.py) hides the copies in and the host's work of all but
the last chunk behind the backward pass; the copy back stays exposed, since
the next forward pass needs the weights. Every concept also pays
tf.distribute's fixed cost per step (the distributed iterator, the merge,
the reductions of the logs), measured on CPUs in benchmarks/RESULTS.md
("Where the fixed cost per step goes").

Example (`predict(100_000_000, Machine.h100_sxm(8))`, 8 GPUs with NVLink,
numbers before any overlap): all-reduce 1.6 ms of NVLink + 0.9 ms update;
the host concepts 7.3 ms of PCIe each way and about 40 ms of host memory
traffic: with NVLink, the host update cannot win on a large model; it can
on machines without GPU-GPU links, small models, or where the devices'
compute is long enough to hide the host's work.
"""

from __future__ import annotations

import dataclasses

from tf_glp.strategy import concepts

ONE_GPU = "one GPU"
CONCEPTS = (*concepts.CONCEPTS, ONE_GPU)


@dataclasses.dataclass(frozen=True)
class Machine:
    """Bandwidths, bytes per second, each direction.

    Attributes:
        gpus: N.
        pcie_bytes_per_s: One GPU's link to the host.
        gpu_link_bytes_per_s: One GPU's GPU-GPU bandwidth (NVLink), or
            None where GPUs talk over PCIe.
        host_memory_bytes_per_s: The host's memory bandwidth.
        gpu_memory_bytes_per_s: One GPU's memory bandwidth.
    """

    gpus: int
    pcie_bytes_per_s: float
    gpu_link_bytes_per_s: float | None
    host_memory_bytes_per_s: float
    gpu_memory_bytes_per_s: float

    def __post_init__(self):
        if self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {self.gpus}")

    @classmethod
    def h100_sxm(cls, gpus: int = 8) -> "Machine":
        """An HGX H100 board: NVLink 4 (450 GB/s per direction per GPU),
        PCIe 5 x16 (about 55 GB/s achieved), two-socket DDR5 (about
        300 GB/s), HBM3 (about 3 TB/s)."""
        return cls(gpus, 55e9, 450e9, 300e9, 3e12)

    @classmethod
    def pcie_workstation(cls, gpus: int = 4) -> "Machine":
        """GPUs on PCIe 4 x16 (about 25 GB/s achieved) without NVLink, one
        socket of DDR4 (about 50 GB/s), GDDR6X (about 1 TB/s)."""
        return cls(gpus, 25e9, None, 50e9, 1e12)


@dataclasses.dataclass(frozen=True)
class ConceptCost:
    """Seconds per step of one concept, before any overlap with compute."""

    concept: str
    link: float  # PCIe or GPU-GPU transfers
    host: float  # host memory traffic
    device_update: float  # the update in GPU memory
    exposed_after_chunking: float  # what chunking cannot hide

    @property
    def total(self) -> float:
        return self.link + self.host + self.device_update


def predict(parameters: int, machine: Machine, state_bytes_per_parameter: int = 24) -> dict[str, ConceptCost]:
    """{concept: ConceptCost} for `parameters` float32 parameters.

    Example:
        >>> costs = predict(100_000_000, Machine.h100_sxm(8))
        >>> round(1e3 * costs["all-reduce"].link, 2), round(1e3 * costs["host"].host, 1)
        (1.56, 40.0)
    """
    if parameters < 0:
        raise ValueError(f"parameters must be >= 0, got {parameters}")
    device_update = (state_bytes_per_parameter + concepts.GRADIENT_BYTES) * parameters / machine.gpu_memory_bytes_per_s
    costs = {name: _cost(concept, machine, parameters, state_bytes_per_parameter)
             for name, concept in concepts.CONCEPTS.items()}
    costs[ONE_GPU] = ConceptCost(ONE_GPU, 0.0, 0.0, device_update, device_update)
    return costs


def _cost(concept: concepts.UpdateConcept, machine: Machine, parameters: int,
          state_bytes_per_parameter: int) -> ConceptCost:
    """The seconds of what `concept` moves on `machine`."""
    traffic = concept.traffic(machine.gpus, parameters, state_bytes_per_parameter)
    pcie = (traffic.pcie_in + traffic.pcie_out) / machine.pcie_bytes_per_s
    link = pcie + traffic.gpu_link / (machine.gpu_link_bytes_per_s or machine.pcie_bytes_per_s)
    host = traffic.host_memory / machine.host_memory_bytes_per_s
    update = traffic.device_memory / machine.gpu_memory_bytes_per_s
    exposed = traffic.pcie_out / machine.pcie_bytes_per_s + (link - pcie) + update
    return ConceptCost(concept.name, link, host, update, exposed_after_chunking=exposed)
