"""tf_glp.Strategy: CPU-assisted data parallelism (see strategy.py).

Importing this package declares every strategy class to the factory
(`tf_glp.Strategy(...)` picks among them: Strategy.__init_subclass__).
"""

from tf_glp.strategy.auto_strategy import AutoStrategy
from tf_glp.strategy.chunking import Chunking, plan_chunks
from tf_glp.strategy.chunking_decision import ChunkingDecision
from tf_glp.strategy.concepts import UpdateConcept
from tf_glp.strategy.cross_device_ops import HostCrossDeviceOps
from tf_glp.strategy.devices import cpu_replica_devices
from tf_glp.strategy.host_strategy import HostStrategy
from tf_glp.strategy.multi_worker_strategy import MultiWorkerHostStrategy, MultiWorkerReplicaStrategy
from tf_glp.strategy.one_device_strategy import SingleDeviceStrategy
from tf_glp.strategy.replica_strategy import ReplicaStrategy
from tf_glp.strategy.settings import Settings
from tf_glp.strategy.strategy import Strategy

__all__ = ["AutoStrategy", "Chunking", "ChunkingDecision", "HostCrossDeviceOps", "HostStrategy",
           "MultiWorkerHostStrategy", "MultiWorkerReplicaStrategy", "ReplicaStrategy", "Settings",
           "SingleDeviceStrategy", "Strategy", "UpdateConcept", "cpu_replica_devices", "plan_chunks"]
