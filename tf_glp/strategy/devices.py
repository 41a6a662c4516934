"""Which devices a tf_glp.Strategy uses, and making logical CPU replicas."""

from __future__ import annotations

import os

import tensorflow as tf

from tf_glp.strategy import cluster

# Where a strategy trains: the factory's first question (placement).
ONE_DEVICE, ONE_MACHINE, WORKERS = "one device", "one machine", "workers"


def cpu_replica_devices(count: int) -> list[str]:
    """`count` logical CPU devices, configured now if TensorFlow allows it.

    TensorFlow fixes its devices the first time it runs an op; after that,
    the number of logical CPUs cannot change.
    """
    if count < 1:
        raise ValueError(f"cpu_replicas must be at least 1, got {count}")
    physical = tf.config.list_physical_devices("CPU")
    try:
        existing = tf.config.get_logical_device_configuration(physical[0])
    except RuntimeError:
        existing = None
    if not existing or len(existing) < count:
        try:
            tf.config.set_logical_device_configuration(
                physical[0], [tf.config.LogicalDeviceConfiguration()] * count)
        except RuntimeError as error:
            have = len(tf.config.list_logical_devices("CPU"))
            if have < count:
                raise RuntimeError(
                    f"tf_glp.Strategy needs {count} logical CPU devices but TensorFlow already "
                    f"initialised its devices with {have}. Create the Strategy before running any "
                    f"TensorFlow op (at the top of the script), or call "
                    f"tf_glp.strategy.cpu_replica_devices({count}) first, or pass cpu_replicas={have}."
                ) from error
    return [f"/cpu:{i}" for i in range(count)]


def default_devices(cpu_replicas: int | None, across_workers: bool = False) -> list[str]:
    """All GPUs; without GPUs, `cpu_replicas` logical CPUs (default: the
    TF_GLP_CPU_REPLICAS environment variable, which tf_glp.launch sets, else
    one per worker across workers and 2 on one machine, where one device is
    not the choice: see placement)."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and cpu_replicas is None:
        return [f"/gpu:{i}" for i in range(len(gpus))]
    if cpu_replicas is None:
        cpu_replicas = cluster.positive_env("TF_GLP_CPU_REPLICAS", 1 if across_workers else 2, int,
                                            "an integer >= 1")
    return cpu_replica_devices(cpu_replicas)


def replicas_reason(settings, across_workers: bool) -> str:
    """Why this worker trains the replicas it does (explain())."""
    if settings.devices is not None:
        return "the devices given"
    if settings.cpu_replicas is not None:
        return f"cpu_replicas={settings.cpu_replicas}"
    if tf.config.list_physical_devices("GPU"):
        return "every GPU this process sees"
    if "TF_GLP_CPU_REPLICAS" in os.environ:
        return f"TF_GLP_CPU_REPLICAS={os.environ['TF_GLP_CPU_REPLICAS']}"
    return ("no GPU and no replica count given: one per worker" if across_workers else
            "no GPU and no replica count given: 2, the default for replicas on one machine")


def all_gpus(devices) -> bool:
    """Whether every one of these device names is a GPU."""
    return all("gpu" in d.lower() for d in devices)


def placement(settings) -> str:
    """Where `tf_glp.Strategy(...)` trains with these Settings: across
    workers (a cluster is given, or in TF_CONFIG or TF_GLP_WORKER_HOSTS);
    on one device when no micro_batches, devices or replica count are given (nor
    TF_GLP_CPU_REPLICAS) and there is no GPU (logical CPU replicas share the
    same cores, so they could only add work); else on one machine's replicas."""
    if cluster.resolve_cluster(settings.cluster_resolver) is not None:
        return WORKERS
    if (settings.micro_batches is None and settings.devices is None and settings.cpu_replicas is None
            and "TF_GLP_CPU_REPLICAS" not in os.environ and not tf.config.list_physical_devices("GPU")):
        return ONE_DEVICE
    return ONE_MACHINE
