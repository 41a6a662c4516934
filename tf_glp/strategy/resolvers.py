"""Clusters from the engines that start workers without writing TF_CONFIG:
SLURM (`srun`), and runtimes that give each worker a rank and the workers'
host names (Kubernetes Indexed Jobs and JobSets, MPI launchers).

Why not TensorFlow's SlurmClusterResolver: it asks `nvidia-smi` for the GPUs
(a CPU node has none: FileNotFoundError), cannot count zero GPUs per node
(range() with step 0), and starts every job's ports at 8888, so two jobs that
share a node collide. `slurm_cluster` reads only SLURM's variables, leaves
the GPUs to tf_glp.Strategy (every GPU the task sees, as on one machine), and
derives the ports from the job id.
"""

from __future__ import annotations

import os
import re

import tensorflow as tf

# A job's ports: one block of PORTS_PER_JOB per job id, from FIRST_PORT;
# jobs whose ids differ by less than PORT_BLOCKS never share a block.
FIRST_PORT, PORTS_PER_JOB, PORT_BLOCKS = 20000, 64, 625
# Where runtimes other than SLURM put a worker's rank, in the order read.
RANK_VARIABLES = ("TF_GLP_RANK", "RANK", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
DEFAULT_PORT = 2222  # (TFJob's port)


def slurm_cluster(port_base: int | None = None, environ=None) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster of the tasks of this SLURM job step (one worker per task).

    Run the script with `srun` (one task per node, or several: each gets its
    own port); tasks are placed in SLURM's default block order (ranks fill
    a node, then the next), checked against this task's own node.

    Args:
        port_base: The first task's port on each node (default: None,
            derived from SLURM_JOB_ID: 20000 + 64 x (job id mod 625)).
        environ: The variables to read (default: None, os.environ).

    Returns:
        A cluster resolver for `tf_glp.Strategy(cluster_resolver=...)`.

    Example:
        >>> # srun --nodes=2 --ntasks-per-node=1 python train.py
        >>> strategy = tf_glp.Strategy(cluster_resolver=tf_glp.slurm_cluster())
    """
    env = os.environ if environ is None else environ

    def read(*names: str) -> str:
        for name in names:
            if env.get(name):
                return env[name]
        raise ValueError(f"slurm_cluster: {' or '.join(names)} is not set: run the script with srun "
                         f"inside a SLURM allocation")

    rank = _integer(read("SLURM_PROCID"), "SLURM_PROCID")
    tasks = _integer(read("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_NTASKS")
    hosts = expand_hostlist(read("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    per_node = expand_tasks_per_node(read("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    distribution = env.get("SLURM_DISTRIBUTION", "block")
    if not distribution.startswith("block"):
        raise ValueError(f"slurm_cluster: SLURM_DISTRIBUTION={distribution!r}: only block placement (SLURM's "
                         f"default: a node's tasks have consecutive ranks) can be read from the environment")
    if len(per_node) != len(hosts) or sum(per_node) != tasks:
        raise ValueError(f"slurm_cluster: the node list {hosts} and tasks per node {per_node} do not make "
                         f"{tasks} tasks")
    if max(per_node) > PORTS_PER_JOB:
        raise ValueError(f"slurm_cluster: {max(per_node)} tasks on one node, at most {PORTS_PER_JOB}")
    if port_base is None:
        port_base = FIRST_PORT + PORTS_PER_JOB * (_integer(read("SLURM_JOB_ID"), "SLURM_JOB_ID") % PORT_BLOCKS)
    if not (0 < port_base and port_base + max(per_node) <= 65536):
        raise ValueError(f"slurm_cluster: port_base must leave room for {max(per_node)} ports in 1..65535, "
                         f"got {port_base}")
    addresses = [f"{host}:{port_base + local}" for host, count in zip(hosts, per_node) for local in range(count)]
    own_node = env.get("SLURMD_NODENAME")
    if not 0 <= rank < tasks:
        raise ValueError(f"slurm_cluster: SLURM_PROCID={rank} is not a rank of {tasks} tasks")
    if own_node and addresses[rank].rpartition(":")[0] != own_node:
        raise ValueError(f"slurm_cluster: rank {rank} runs on {own_node}, but block placement of "
                         f"{dict(zip(hosts, per_node))} puts it on {addresses[rank].rpartition(':')[0]}")
    return _resolver(addresses, rank)


def environment_cluster(hosts=None, rank: int | None = None, port: int = DEFAULT_PORT,
                        environ=None) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster named by a host list and this worker's rank, for runtimes
    that give those instead of TF_CONFIG (a Kubernetes Indexed Job or
    JobSet, an MPI launcher).

    Args:
        hosts: The workers' "host" or "host:port", in rank order: a list,
            a comma-separated string, or one name with "{index}" in it,
            repeated for TF_GLP_WORKERS (else WORLD_SIZE) workers (default:
            None, the TF_GLP_WORKER_HOSTS variable).
        rank: This worker's rank (default: None, the first of TF_GLP_RANK,
            RANK, JOB_COMPLETION_INDEX, OMPI_COMM_WORLD_RANK, PMI_RANK).
        port: The port of a host given without one (default: 2222).
        environ: The variables to read (default: None, os.environ).

    Returns:
        A cluster resolver for `tf_glp.Strategy(cluster_resolver=...)`.

    Example:
        >>> # an Indexed Job of 4 pods behind the headless service "train"
        >>> resolver = tf_glp.environment_cluster("train-{index}.train", port=2222)
        >>> strategy = tf_glp.Strategy(cluster_resolver=resolver)
    """
    env = os.environ if environ is None else environ
    if hosts is None:
        hosts = env.get("TF_GLP_WORKER_HOSTS")
        if not hosts:
            raise ValueError("environment_cluster: no hosts given and TF_GLP_WORKER_HOSTS is not set")
    names = [h.strip() for h in hosts.split(",")] if isinstance(hosts, str) else [str(h) for h in hosts]
    if len(names) == 1 and "{index}" in names[0]:
        count_name = next((n for n in ("TF_GLP_WORKERS", "WORLD_SIZE") if env.get(n)), None)
        if count_name is None:
            raise ValueError(f"environment_cluster: {names[0]!r} needs a worker count: set TF_GLP_WORKERS "
                             f"or WORLD_SIZE")
        names = [names[0].replace("{index}", str(i)) for i in range(_integer(env[count_name], count_name))]
    if not names or not all(names):
        raise ValueError(f"environment_cluster: hosts must name at least one host, got {hosts!r}")
    addresses = [name if re.fullmatch(r".+:\d+", name) else f"{name}:{port}" for name in names]
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"environment_cluster: an address appears twice in {addresses}")
    if rank is None:
        name = next((n for n in RANK_VARIABLES if env.get(n)), None)
        if name is None:
            raise ValueError(f"environment_cluster: no rank given and none of {', '.join(RANK_VARIABLES)} is set")
        rank = _integer(env[name], name)
    if not 0 <= rank < len(addresses):
        raise ValueError(f"environment_cluster: rank {rank} is not a rank of {len(addresses)} workers")
    return _resolver(addresses, rank)


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed node list ("node[01-03,07],gpu1") as host names."""
    hosts = []
    for name in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", name)
        if match is None:
            hosts.append(name)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{width}d}{suffix}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node ("2(x3),1") as one count per node."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"slurm_cluster: cannot read the tasks per node {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _resolver(addresses: list[str], rank: int):
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": addresses}), task_type="worker", task_id=rank, rpc_layer="grpc")
