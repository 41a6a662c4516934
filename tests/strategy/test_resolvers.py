"""Clusters from SLURM's and other runtimes' variables (strategy/resolvers.py),
read from simulated environments: the addresses every task computes are the
same list, each task finds itself in it, two jobs on one node get different
ports, and what cannot be read is named."""

import pytest

from tf_glp.strategy import resolvers


def _slurm(rank, node, **extra):
    """What srun sets for a task of job 4242 on 3 nodes, 2 tasks each (CPU nodes: no GPU variable)."""
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "6", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "cpu[07-08],big1", "SLURM_TASKS_PER_NODE": "2(x3)",
            "SLURMD_NODENAME": node, **extra}


def _workers(resolver) -> list[str]:
    return resolver.cluster_spec().as_dict()["worker"]


def test_slurm_tasks_agree_on_the_cluster_and_find_themselves():
    nodes = ["cpu07", "cpu07", "cpu08", "cpu08", "big1", "big1"]
    base = resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (4242 % resolvers.PORT_BLOCKS)
    expected = [f"{node}:{base + rank % 2}" for rank, node in enumerate(nodes)]
    for rank, node in enumerate(nodes):
        resolver = resolvers.slurm_cluster(environ=_slurm(rank, node))
        assert _workers(resolver) == expected
        assert (resolver.task_type, resolver.task_id) == ("worker", rank)
        assert resolver.cluster_spec().task_address("worker", rank).startswith(node + ":")


def test_two_slurm_jobs_on_one_node_get_different_ports():
    first = set(_workers(resolvers.slurm_cluster(environ=_slurm(0, "cpu07"))))
    second = set(_workers(resolvers.slurm_cluster(environ=_slurm(0, "cpu07", SLURM_JOB_ID="4243"))))
    assert not first & second


def test_slurm_step_variables_come_first_and_port_base_overrides():
    env = _slurm(1, "n2", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_NODELIST="n[1-2]", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    assert _workers(resolvers.slurm_cluster(port_base=3000, environ=env)) == ["n1:3000", "n2:3000"]


@pytest.mark.parametrize("change, message", [
    ({"SLURM_PROCID": None}, "SLURM_PROCID is not set: run the script with srun"),
    ({"SLURM_NTASKS": "5"}, "do not make 5 tasks"),
    ({"SLURM_PROCID": "6"}, "SLURM_PROCID=6 is not a rank of 6 tasks"),
    ({"SLURMD_NODENAME": "cpu08"}, "rank 0 runs on cpu08, but block placement"),
    ({"SLURM_DISTRIBUTION": "cyclic"}, "SLURM_DISTRIBUTION='cyclic': only block placement"),
    ({"SLURM_TASKS_PER_NODE": "two"}, "cannot read the tasks per node 'two'"),
    ({"SLURM_JOB_ID": "x"}, "SLURM_JOB_ID must be an integer, got 'x'"),
])
def test_slurm_environments_that_cannot_be_read_are_named(change, message):
    env = {k: v for k, v in {**_slurm(0, "cpu07"), **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        resolvers.slurm_cluster(environ=env)


def test_slurm_port_base_must_fit():
    with pytest.raises(ValueError, match="port_base must leave room for 2 ports in 1..65535, got 65535"):
        resolvers.slurm_cluster(port_base=65535, environ=_slurm(0, "cpu07"))


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("cpu[07-08],big1", ["cpu07", "cpu08", "big1"]),
    ("a[1,3-4]x,b[9-10]", ["a1x", "a3x", "a4x", "b9", "b10"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert resolvers.expand_hostlist(text) == hosts


def test_environment_cluster_from_an_indexed_job():
    env = {"JOB_COMPLETION_INDEX": "2", "TF_GLP_WORKERS": "3"}
    resolver = resolvers.environment_cluster("train-{index}.train", environ=env)
    assert _workers(resolver) == ["train-0.train:2222", "train-1.train:2222", "train-2.train:2222"]
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)


def test_environment_cluster_from_variables_with_ports():
    env = {"TF_GLP_WORKER_HOSTS": "a:1000, b", "RANK": "0", "JOB_COMPLETION_INDEX": "1"}
    resolver = resolvers.environment_cluster(port=3000, environ=env)
    assert _workers(resolver) == ["a:1000", "b:3000"]
    assert resolver.task_id == 0  # (RANK is read before JOB_COMPLETION_INDEX)


@pytest.mark.parametrize("hosts, env, message", [
    (None, {"RANK": "0"}, "no hosts given and TF_GLP_WORKER_HOSTS is not set"),
    ("w-{index}", {"RANK": "0"}, "needs a worker count: set TF_GLP_WORKERS or WORLD_SIZE"),
    ("a,b", {}, "no rank given and none of TF_GLP_RANK"),
    ("a,b", {"RANK": "2"}, "rank 2 is not a rank of 2 workers"),
    ("a,a:2222", {"RANK": "0"}, "an address appears twice"),
    ("a,,b", {"RANK": "0"}, "hosts must name at least one host"),
])
def test_environment_cluster_errors_name_what_is_missing(hosts, env, message):
    with pytest.raises(ValueError, match=message):
        resolvers.environment_cluster(hosts, environ=env)
