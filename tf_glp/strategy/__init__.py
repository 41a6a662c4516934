"""tf_glp.Strategy: CPU-assisted data parallelism (see strategy.py)."""

from tf_glp.strategy.chunking import Chunking, plan_chunks
from tf_glp.strategy.chunking_decision import ChunkingDecision
from tf_glp.strategy.cross_device_ops import HostCrossDeviceOps
from tf_glp.strategy.devices import cpu_replica_devices
from tf_glp.strategy.strategy import AutoStrategy, HostStrategy, ReplicaStrategy, Strategy

__all__ = ["AutoStrategy", "Chunking", "ChunkingDecision", "HostCrossDeviceOps", "HostStrategy", "ReplicaStrategy", "Strategy",
           "cpu_replica_devices", "plan_chunks"]
