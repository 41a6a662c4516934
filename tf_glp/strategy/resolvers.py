"""Clusters from the engines that start workers without writing TF_CONFIG:
SLURM (`srun`), and runtimes that give each worker a rank and the workers'
host names (Kubernetes Indexed Jobs and JobSets, MPI launchers).

Why not TensorFlow's SlurmClusterResolver: it asks `nvidia-smi` for the GPUs
(a CPU node has none: FileNotFoundError), cannot count zero GPUs per node
(range() with step 0), and starts every job's ports at 8888, so two jobs that
share a node collide. `slurm_cluster` reads only SLURM's variables, leaves
the GPUs to tf_glp.Strategy (every GPU the task sees, as on one machine), and
takes the ports SLURM reserved for the step (SLURM_STEP_RESV_PORTS), else a
block derived from the job id.
"""

from __future__ import annotations

import itertools
import math
import os
import re

import tensorflow as tf

# A job's ports when SLURM reserved none for the step (no `srun --resv-ports`):
# one block of PORTS_PER_JOB per job id, from FIRST_PORT; jobs whose ids differ
# by less than PORT_BLOCKS never share a block on a node. Why 61000-65535:
# below it lies Linux's default ephemeral range, 32768-60999
# (/proc/sys/net/ipv4/ip_local_port_range), where the kernel picks the local
# port of every outgoing connection, so any process's client socket may hold a
# port of the block for a while; below 32768 lie registered services (SLURM's
# own 6817-6819, the 12000-12999 of SLURM's MpiParams=ports example, databases,
# Jupyter's 8888). 61000-65535 is in IANA's dynamic range (49152-65535, RFC
# 6335), where no service is registered. The block is a constant, not read from
# the node, because every task computes every other task's port. 32 ports: the
# most tasks on one node without a reservation (twice a 16-GPU node's); 141
# blocks fit.
FIRST_PORT, PORTS_PER_JOB = 61000, 32
PORT_BLOCKS = (65536 - FIRST_PORT) // PORTS_PER_JOB
# Where SLURM writes the ports it reserved for a step on every node of the step.
RESERVED_PORTS_VARIABLE = "SLURM_STEP_RESV_PORTS"
# SLURM's limit on the hosts of one range (MAX_RANGE in src/common/hostlist.h,
# MAX_SLURM_NODES): longer lists are refused rather than built.
MAX_HOSTS = 65536
# The workers' host list environment_cluster reads by default, and
# tf_glp.Strategy() where no TF_CONFIG is set (cluster.resolve_cluster).
HOSTS_VARIABLE = "TF_GLP_WORKER_HOSTS"
# Where runtimes other than SLURM put a worker's rank, in the order read.
RANK_VARIABLES = ("TF_GLP_RANK", "RANK", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
DEFAULT_PORT = 2222  # (TFJob's port)


def slurm_cluster(port_base: int | None = None, environ=None) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster of the tasks of this SLURM job step (one worker per task).

    Run the script with `srun` (one task per node, or several: each gets its
    own port); tasks are placed in SLURM's default block order (ranks fill
    a node, then the next), checked against this task's own node.

    A node's i-th task (in rank order) listens on the i-th port of, first
    found: `port_base`, `port_base + 1`, ...; the ports SLURM reserved for
    the step on every node, SLURM_STEP_RESV_PORTS (e.g. "12000-12003": with
    MpiParams=ports in slurm.conf, for every step, or `srun --resv-ports=N`);
    else a block of 32 from the job id, 61000 + 32 x (SLURM_JOB_ID mod 141),
    outside Linux's ephemeral ports. Every task reads the same variables, so
    all agree on every address; a port found taken at start-up is named
    with where it came from and the fix.

    Args:
        port_base: The first task's port on each node (default: None, as
            above: SLURM_STEP_RESV_PORTS, else the job id's block).
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
    ports, origin = _slurm_ports(env, read, max(per_node), port_base)
    # (host, index of the task on its host) in rank order: block placement.
    placement = [(host, local) for host, count in zip(hosts, per_node) for local in range(count)]
    addresses = [f"{host}:{ports[local]}" for host, local in placement]
    own_node = env.get("SLURMD_NODENAME")
    if not 0 <= rank < tasks:
        raise ValueError(f"slurm_cluster: SLURM_PROCID={rank} is not a rank of {tasks} tasks")
    if own_node and placement[rank][0] != own_node:
        raise ValueError(f"slurm_cluster: rank {rank} runs on {own_node}, but block placement of "
                         f"{dict(zip(hosts, per_node))} puts it on {placement[rank][0]}")
    local = placement[rank][1]
    return _resolver(addresses, rank, port_origin=origin(ports[local], local))


def _slurm_ports(env, read, most_tasks: int, port_base: int | None):
    """The ports of a node's tasks in local order (`most_tasks` of them), and
    a function (port, local index) -> where this task's port came from and
    what to do when another process holds it (cluster.py's port check
    prints it)."""
    job = env.get("SLURM_JOB_ID")
    of_job = f" of SLURM job {job}" if job else ""
    reserved = env.get(RESERVED_PORTS_VARIABLE, "").strip()
    if port_base is not None:
        if not (0 < port_base and port_base + most_tasks <= 65536):
            raise ValueError(f"slurm_cluster: port_base must leave room for {most_tasks} ports in 1..65535, "
                             f"got {port_base}")
        return list(range(port_base, port_base + most_tasks)), lambda port, local: (
            f"Port {port} is port_base={port_base} + {local} (the task's index on its node), given to "
            f"slurm_cluster(){of_job}; another process holds it. Pass another port_base, or leave it out "
            f"and run the step with `srun --resv-ports={most_tasks}` (SLURM then reserves the step's ports).")
    if reserved:
        what = f"slurm_cluster: {RESERVED_PORTS_VARIABLE}={reserved!r}"
        ports = [int(port) for port in _range_list(reserved, what)]
        if not all(0 < port < 65536 for port in ports) or len(set(ports)) != len(ports):
            raise ValueError(f"{what} must name distinct ports in 1..65535")
        if len(ports) < most_tasks:
            raise ValueError(f"{what} reserves {len(ports)} ports, but a node runs {most_tasks} tasks of this "
                             f"step: run it with `srun --resv-ports={most_tasks}` or more, or pass "
                             f"slurm_cluster(port_base=...)")
        return ports[:most_tasks], lambda port, local: (
            f"Port {port} is port {local + 1} (for the task of index {local} on its node) of "
            f"{RESERVED_PORTS_VARIABLE}={reserved!r}, the ports SLURM reserved for this step{of_job} "
            f"(`srun --resv-ports`); a process SLURM does not manage holds it. Ask the administrators to keep "
            f"slurm.conf's MpiParams=ports clear of other services, or pass slurm_cluster(port_base=...) a "
            f"free range (it overrides the reservation).")
    if most_tasks > PORTS_PER_JOB:
        raise ValueError(f"slurm_cluster: {most_tasks} tasks on one node, but a job's fallback block holds "
                         f"{PORTS_PER_JOB} ports: run the step with `srun --resv-ports={most_tasks}`, or pass "
                         f"slurm_cluster(port_base=...)")
    job_id = _integer(read("SLURM_JOB_ID"), "SLURM_JOB_ID")
    base = FIRST_PORT + PORTS_PER_JOB * (job_id % PORT_BLOCKS)
    return list(range(base, base + most_tasks)), lambda port, local: (
        f"Port {port} is {base} + {local} (the task's index on its node): slurm_cluster's fallback block for "
        f"SLURM job {job_id}, {FIRST_PORT} + {PORTS_PER_JOB} x ({job_id} mod {PORT_BLOCKS}), which SLURM did not "
        f"reserve; another process holds it (a job whose id differs by a multiple of {PORT_BLOCKS} shares the "
        f"block). Run the step with `srun --resv-ports={most_tasks}` (SLURM then reserves the step's ports and "
        f"sets {RESERVED_PORTS_VARIABLE}; it needs MpiParams=ports in slurm.conf), or pass "
        f"slurm_cluster(port_base=...) a free range.")


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
        hosts = env.get(HOSTS_VARIABLE)
        if not hosts:
            raise ValueError(f"environment_cluster: no hosts given and {HOSTS_VARIABLE} is not set")
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
    """SLURM's host list ("node[01-03,07],gpu1") as host names, in the order
    `scontrol show hostnames` gives them.

    The grammar is SLURM's (src/common/hostlist.c, documented in slurm.conf(5)
    under NODE CONFIGURATION): names separated by commas or whitespace (not
    the commas inside brackets); in a name, any number of brackets, each
    holding comma-separated numbers and ranges "low-high" (`n[1,3,5-7]`),
    numbers padded with zeros to the width of the written lower bound
    (`n[01-10]`: n01 ... n10), text after the last bracket kept
    (`node[1-2]-int`). Note [SLURM's bracket order] says in which order
    several brackets in one name are expanded.

    Raises:
        ValueError: Naming the bad part, for what SLURM's own parser refuses
            (an unclosed bracket, "[]", a range whose lower bound exceeds its
            upper bound, a bound that is not digits, e.g. the steps "1-9:2"
            that SLURM has no syntax for; a range of more than 65536 hosts),
            for an empty name (SLURM skips it; it never writes one), and for
            what SLURM reads in ways no one means (nested or stray brackets,
            signs or spaces in a range).

    Example:
        >>> expand_hostlist("rack[1-2]-n[01-02],big1")
        ['rack1-n01', 'rack1-n02', 'rack2-n01', 'rack2-n02', 'big1']
    """
    return [host for name in _hostlist_names(text) for host in _expand_name(name, text)]


def _hostlist_names(text: str) -> list[str]:
    """The names of a host list (brackets unexpanded): split at commas and
    whitespace outside brackets, brackets checked to open and close in turn."""
    names, name, depth, since_comma = [], "", 0, 0  # since_comma: names ended since the last comma

    def end_name() -> None:
        nonlocal name, since_comma
        if name:
            names.append(name)
            name, since_comma = "", since_comma + 1

    for position, char in enumerate(text):
        if depth == 0 and (char == "," or char.isspace()):
            end_name()
            if char == ",":
                if not since_comma:
                    raise ValueError(f"SLURM host list {text!r} has an empty name before the comma at "
                                     f"character {position}")
                since_comma = 0
            continue
        if char == "[" and depth:
            raise ValueError(f"SLURM host list {text!r} has a bracket inside a bracket at character {position}")
        if char == "]" and not depth:
            raise ValueError(f"SLURM host list {text!r} closes a bracket it did not open at character {position}")
        depth = {"[": 1, "]": 0}.get(char, depth)
        name += char
    if depth:
        raise ValueError(f"SLURM host list {text!r} does not close its last bracket")
    end_name()
    if not since_comma:
        raise ValueError(f"SLURM host list {text!r} ends without a name" if names else
                         f"SLURM host list {text!r} names no host")
    return names


# Note [SLURM's bracket order]
# SLURM (hostlist.c, _hostlist_create_bracketed and _push_range_list) expands
# the last bracket of a name innermost, then recurses into the bracket before
# it, whose loop holds the expansion of the brackets further left. So the
# last bracket varies fastest, then the first, the second, ..., and the one
# before the last slowest: with two brackets the left one is slowest
# (rack[1-2]-n[01-02]: rack1-n01, rack1-n02, rack2-n01, rack2-n02); with three,
# a[1-2]b[3-4]c[5-6] gives a1b3c5, a1b3c6, a2b3c5, a2b3c6, a1b4c5, ... (seen
# from libslurm 22.05's slurm_hostlist_create; the code is the same in
# SLURM 25.11). Ranks follow this order, so it is SLURM's that counts.
def _expand_name(name: str, text: str) -> list[str]:
    """One name of a host list, its brackets expanded in SLURM's order."""
    literals, brackets, rest = [], [], name
    while "[" in rest:  # (_hostlist_names checked that each "[" has its "]")
        literal, _, rest = rest.partition("[")
        inside, _, rest = rest.partition("]")
        literals.append(literal)
        brackets.append(_range_list(inside, f"SLURM host list {text!r}, in {name!r}"))
    if not brackets:
        return [name]
    if math.prod(len(numbers) for numbers in brackets) > MAX_HOSTS:
        raise ValueError(f"SLURM host list {text!r}: {name!r} names more than {MAX_HOSTS} hosts")
    slowest_first = [*range(len(brackets) - 2, -1, -1), len(brackets) - 1]
    hosts = []
    for numbers in itertools.product(*(brackets[i] for i in slowest_first)):
        number_of = dict(zip(slowest_first, numbers))
        hosts.append("".join(literal + number_of[i] for i, literal in enumerate(literals)) + rest)
    return hosts


def _range_list(text: str, what: str) -> list[str]:
    """SLURM's range list ("1,3,05-07", a bracket's inside, or the ports of
    SLURM_STEP_RESV_PORTS) as numbers, each as wide as the lower bound of its
    range is written ("05-07": 05, 06, 07)."""
    numbers = []
    for item in text.split(","):
        low, dash, high = item.partition("-")
        if not (_digits(low) and (_digits(high) or not dash)):
            raise ValueError(f"{what}: {item!r} is not a number or a range 'low-high' of numbers (SLURM's "
                             f"ranges have no steps or other forms)")
        first, last = int(low), int(high or low)
        if first > last:
            raise ValueError(f"{what}: the range {item!r} runs backwards ({first} > {last})")
        if len(numbers) + last - first + 1 > MAX_HOSTS:
            raise ValueError(f"{what}: {text!r} holds more than {MAX_HOSTS} numbers")
        numbers += [f"{number:0{len(low)}d}" for number in range(first, last + 1)]
    return numbers


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


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


class _PortOriginResolver(tf.distribute.cluster_resolver.SimpleClusterResolver):
    """A SimpleClusterResolver that says where this task's port came from:
    cluster.py's port check prints `port_origin` when the port is taken."""

    def __init__(self, cluster_spec, *, task_id: int, port_origin: str):
        super().__init__(cluster_spec, task_type="worker", task_id=task_id, rpc_layer="grpc")
        self.port_origin = port_origin


def _resolver(addresses: list[str], rank: int, port_origin: str | None = None):
    spec = tf.train.ClusterSpec({"worker": addresses})
    if port_origin is None:
        return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=rank,
                                                                    rpc_layer="grpc")
    return _PortOriginResolver(spec, task_id=rank, port_origin=port_origin)
