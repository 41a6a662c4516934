"""tf_glp.Strategy's settings: the one source of truth for what the user
passed. Built by keyword (Strategy.__new__), frozen, read by every strategy
class and printed by explain().

Each setting has its one default here (Strategy's signature reads it from
this class) and is checked here, in `__post_init__`, with its owner's rule
where it has one (chunking.py, compression.py, concepts.py); only what needs
the devices (micro_batches against the replica count: micro_batches.py) is
checked when the strategy sets up.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any

from tf_glp.strategy import chunking, compression, concepts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The arguments of tf_glp.Strategy (see its docstring for each).

    Example:
        >>> Settings(update="replicas", chunking=4, micro_batches=2)
        Settings(update='replicas', chunking=4, compression=None, micro_batches=2)
    """

    devices: tuple[str, ...] | None = None
    update: str = concepts.AUTO
    chunking: int | str = "auto"
    compression: str | None = None
    cpu_replicas: int | None = None
    cluster_resolver: Any = None
    micro_batches: int | None = None
    plan_path: str | None = "auto"  # tf_glp.tuning.store.AUTO: the user's cache
    allow_xla: bool = False

    def __post_init__(self):
        concepts.check_setting(self.update)
        if self.devices is not None:
            if self.cpu_replicas is not None:
                raise ValueError("pass either devices or cpu_replicas, not both")
            object.__setattr__(self, "devices", tuple(self.devices))
            if not self.devices:
                raise ValueError("devices must not be empty")
        if self.cpu_replicas is not None:
            if isinstance(self.cpu_replicas, bool) or not isinstance(self.cpu_replicas, numbers.Integral):
                raise ValueError(f"cpu_replicas must be None or an int, got {self.cpu_replicas!r}")
            if self.cpu_replicas < 1:
                raise ValueError(f"cpu_replicas must be at least 1, got {self.cpu_replicas}")
        if self.plan_path is not None:
            if not isinstance(self.plan_path, (str, os.PathLike)):
                raise ValueError(f"plan_path must be 'auto', a file's path or None, got {self.plan_path!r}")
            object.__setattr__(self, "plan_path", os.fspath(self.plan_path))
        if not isinstance(self.allow_xla, bool):
            raise ValueError(f"allow_xla must be True or False, got {self.allow_xla!r}")
        chunking.validate_chunking(self.chunking)
        compression.get(self.compression)
        if self.micro_batches is not None:
            if (isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, numbers.Integral)
                    or self.micro_batches < 1):
                raise ValueError(f"tf_glp.Strategy: micro_batches must be None or a positive int, "
                                 f"got {self.micro_batches!r}")
            if self.compression:
                raise ValueError(f"tf_glp.Strategy: micro_batches={self.micro_batches} sums the micro-batches' "
                                 f"gradients in float32 as they are; compression={self.compression!r} cannot "
                                 f"apply to them: pass one")

    def describe(self) -> str:
        """The settings as arguments: update, chunking and compression
        always, the others where they differ from their defaults."""
        always = ("update", "chunking", "compression")
        return ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)
                         if field.name in always or getattr(self, field.name) != field.default)

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"
