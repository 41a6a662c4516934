"""tf_glp.Strategy with update="auto" on one machine: the update concept is
chosen at the start of the first fit (update_choice.py), "host" until then."""

from __future__ import annotations

import tensorflow as tf

from tf_glp.strategy import concepts, update_choice
from tf_glp.strategy.host_strategy import HostMirroredExtended
from tf_glp.strategy.strategy import HOST_DEVICE, ONE_MACHINE, Strategy


class AutoStrategy(Strategy, tf.distribute.MirroredStrategy, placement=ONE_MACHINE, serves=(concepts.AUTO,)):
    """tf_glp.Strategy with update="auto" (see Strategy and update_choice.py).
    The concept in use is `update_concept` (its name: `concept`)."""

    _measures_concept = True

    def _init_distribution(self) -> None:
        devices = self._set_up()
        self.update_choice = update_choice.UpdateChoice(self)
        if self.micro_batches:
            self.update_choice.decide(concepts.DEFAULT, "micro_batches: the concept whose micro-batched "
                                                             "result is kept bitwise (not measured)")
        tf.distribute.Strategy.__init__(self, HostMirroredExtended(
            self, devices, self._host_ops, HOST_DEVICE, on_host=lambda: self.update_concept.steps_on_host))

    @property
    def update_concept(self) -> concepts.UpdateConcept:
        """The concept chosen (or, until the choice, the default); while
        update="auto" measures, the candidate being timed (an injected clock
        reads its name, `concept`)."""
        return self.update_choice.concept

    def _own_choices(self) -> dict:
        return {"concept": self.update_choice}

    def explain(self) -> str:
        """Strategy.explain(), with the update choice and its times."""
        lines = super().explain().split("\n")
        return "\n".join([lines[0], f"  {self.update_choice.line()}", *lines[1:]])
