"""tf_glp.Strategy's settings: typed once (Strategy.__new__), kept in one
frozen object that every strategy class reads, printed by explain().

Settings checks what concerns the strategy as a whole (the update mode,
devices against cpu_replicas). A setting with an owner is validated by
that owner when the strategy is set up: chunking by strategy.chunking,
compression by the host reductions (cross_device_ops.py), micro_batches
against the replica count by micro_batches.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

UPDATES = ("host", "replicas", "auto")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The arguments of tf_glp.Strategy (see its docstring for each).

    Example:
        >>> Settings(update="replicas", chunking=4, micro_batches=2)
        Settings(update='replicas', chunking=4, compression=None, micro_batches=2)
    """

    devices: tuple[str, ...] | None = None
    update: str = "auto"
    chunking: int | str = "auto"
    compression: str | None = None
    cpu_replicas: int | None = None
    cluster_resolver: Any = None
    micro_batches: int | None = None
    plan_path: str | None = "glp_strategy_plan.json"

    def __post_init__(self):
        if self.update not in UPDATES:
            raise ValueError(f"update must be 'host', 'replicas' or 'auto', got {self.update!r}")
        if self.devices is not None:
            if self.cpu_replicas is not None:
                raise ValueError("pass either devices or cpu_replicas, not both")
            object.__setattr__(self, "devices", tuple(self.devices))
            if not self.devices:
                raise ValueError("devices must not be empty")

    def describe(self) -> str:
        """The settings as arguments: update, chunking and compression
        always, the others where they differ from their defaults."""
        always = ("update", "chunking", "compression")
        return ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)
                         if field.name in always or getattr(self, field.name) != field.default)

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"
