"""The update concepts: where the replicas' gradients are summed and where the
optimizer step runs. One object per concept, in one registry.

Note [One word: concept]
~~~~~~~~~~~~~~~~~~~~~~~~
"Update" is the optimizer's update, Keras' word (what `optimizer.apply`
does); a "concept" is how a data-parallel step gets there (the DIDL 2018
paper's word): who sums the gradients, and where the update runs. The
setting keeps Keras users' name, `tf_glp.Strategy(update=...)`, and its
value names a concept (or "auto": measured, update_choice.py). Everything
else, in code, docs and output, says concept. Only this module compares
concept names; everywhere else holds an UpdateConcept and asks it.

The concepts (all compute the same update, up to the order of a sum):

- "host" (ICPE 2018): the host sums the replicas' gradients chunk by chunk
  and runs the optimizer step once, on its copies of the weights
  (host_copies.py), through the fused native update where Keras' optimizer
  has one; the weights are copied back to the replicas.
- "replicas": the host sums; every replica applies the sum with its own
  optimizer state.
- "all-reduce": TensorFlow's own all-reduce (NCCL on GPUs, a reduction to
  one device on CPU devices), every replica applies the sum:
  MirroredStrategy's concept. Only update="auto" runs it (the user's way
  to ask for it is MirroredStrategy).

Adding a concept: docs/building.md (Update concepts).
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from tf_glp._keras import compat

AUTO = "auto"  # the setting whose concept is measured (update_choice.py)
GRADIENT_BYTES = 4  # float32


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes one training step moves under a concept, before any overlap
    (concept_model.py turns them into seconds for a machine).

    Attributes:
        pcie_in: Per GPU, device to host (the gradients).
        pcie_out: Per GPU, host to device (new weights or the sums): the
            part chunking cannot hide, since the next forward pass needs it.
        gpu_link: Per GPU, sent over GPU-GPU links (the ring).
        host_memory: Read and written in host memory.
        device_memory: Per GPU, read and written by the update in GPU memory.
    """

    pcie_in: float = 0.0
    pcie_out: float = 0.0
    gpu_link: float = 0.0
    host_memory: float = 0.0
    device_memory: float = 0.0


class UpdateConcept:
    """One way a data-parallel step sums the gradients and applies the update.

    Attributes:
        name: The value of the `update=` setting (and of update="auto"'s
            choice, in plan files and output).
        summary: One line for explain(), docs and the compare tool.
        sums_on_host: The host sums the replicas' gradients
            (HostCrossDeviceOps): `compression` applies to those sums only.
        steps_on_host: The optimizer step runs once, on the host copies;
            only there does the fused native update apply.
        settable: Can be passed as `update=` (else only update="auto"
            runs it).
    """

    name: str
    summary: str
    sums_on_host = True
    steps_on_host = False
    settable = True

    def sum_gradients(self, strategy, grads: list, loss_scaled: bool) -> list:
        """The replicas' gradients summed, in the step's merge: on the host
        (an fp16 overflow in a loss-scaled step: compression.compress)."""
        return strategy._host_ops.reduce_to_host(grads, gradients=True,
                                                 overflow="propagate" if loss_scaled else "raise")

    def optimizer_step(self, strategy, optimizer, variables):
        """Context in which Keras' own apply runs the step (on the replicas)."""
        del strategy, optimizer, variables
        return contextlib.nullcontext()

    def traffic(self, gpus: int, parameters: int, state_bytes_per_parameter: int) -> Traffic:
        """What one step moves on `gpus` GPUs for `parameters` float32
        parameters and an optimizer reading and writing
        `state_bytes_per_parameter` bytes of state per parameter."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<update concept {self.name!r}>"


class HostConcept(UpdateConcept):
    name = "host"
    summary = "the host sums the replicas' gradients and runs the optimizer step once, on its copies of the weights"
    steps_on_host = True

    def optimizer_step(self, strategy, optimizer, variables):
        # The optimizer's own list too: Keras' EMA reads it.
        return strategy.extended.host_update(list(variables) + compat.built_variables(optimizer))

    def traffic(self, gpus, parameters, state_bytes_per_parameter):
        # In: N copies written, read by the sum; the state; N copies out.
        grad = GRADIENT_BYTES * parameters
        return Traffic(pcie_in=grad, pcie_out=grad,
                       host_memory=3 * gpus * grad + state_bytes_per_parameter * parameters)


class ReplicasConcept(UpdateConcept):
    name = "replicas"
    summary = "the host sums the replicas' gradients; every replica applies the sum with its own optimizer state"

    def traffic(self, gpus, parameters, state_bytes_per_parameter):
        grad = GRADIENT_BYTES * parameters
        return Traffic(pcie_in=grad, pcie_out=grad, host_memory=3 * gpus * grad + grad,
                       device_memory=(state_bytes_per_parameter + GRADIENT_BYTES) * parameters)


class AllReduceConcept(UpdateConcept):
    name = "all-reduce"
    summary = ("TensorFlow's own all-reduce (NCCL on GPUs), every replica applies the sum: "
               "MirroredStrategy's concept")
    sums_on_host = False
    settable = False

    def sum_gradients(self, strategy, grads, loss_scaled):
        # TensorFlow sums the replicas' gradients onto every replica (a
        # gradient that is one tensor shared by every replica passes as it
        # is, counted once).
        del loss_scaled
        grads = list(grads)
        distributed = [i for i, g in enumerate(grads) if isinstance(g, tf.distribute.DistributedValues)]
        if not distributed:
            return grads
        summed = strategy._tf_all_reduce.batch_reduce(
            tf.distribute.ReduceOp.SUM, [(grads[i], grads[i]) for i in distributed])
        for i, total in zip(distributed, summed):
            grads[i] = total
        return grads

    def traffic(self, gpus, parameters, state_bytes_per_parameter):
        grad = GRADIENT_BYTES * parameters
        return Traffic(gpu_link=2 * (gpus - 1) / gpus * grad,
                       device_memory=(state_bytes_per_parameter + GRADIENT_BYTES) * parameters)


HOST, REPLICAS, ALL_REDUCE = HostConcept(), ReplicasConcept(), AllReduceConcept()
CONCEPTS: dict[str, UpdateConcept] = {c.name: c for c in (HOST, REPLICAS, ALL_REDUCE)}
DEFAULT = HOST  # what update="auto" keeps unless another wins, and runs where it cannot measure
# What `update=` can ask for: a settable concept, or AUTO (measured); and
# the values `update=` accepts, in the same order. Strategy classes serve
# the former (strategy.py's factory).
SERVED = tuple(concept for concept in CONCEPTS.values() if concept.settable) + (AUTO,)
SETTINGS = tuple(served if served == AUTO else served.name for served in SERVED)


def get(name: str) -> UpdateConcept:
    """The concept named `name`; ValueError naming the known ones."""
    if name not in CONCEPTS:
        raise ValueError(f"unknown update concept {name!r}; known: {', '.join(map(repr, CONCEPTS))}")
    return CONCEPTS[name]


def check_setting(update) -> None:
    """ValueError unless `update` is a value `update=` accepts."""
    if update not in SETTINGS:
        names = [repr(name) for name in SETTINGS]
        raise ValueError(f"update must be {', '.join(names[:-1])} or {names[-1]}, got {update!r}")


def is_measured(update: str) -> bool:
    """Whether the setting leaves the concept to measurement (update="auto")."""
    return update == AUTO


def served(update: str):
    """What the setting asks for: its concept, or AUTO (of SERVED)."""
    return SERVED[SETTINGS.index(update)]


def setting(served_: UpdateConcept | str) -> str:
    """The setting that asks for `served_` (of SERVED)."""
    return SETTINGS[SERVED.index(served_)]


def for_setting(update: str) -> UpdateConcept:
    """The concept a setting runs before (or without) a measurement: its
    own, or for update="auto" the default."""
    return DEFAULT if is_measured(update) else get(update)
