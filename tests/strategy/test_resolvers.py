"""Clusters from SLURM's and other runtimes' variables (strategy/resolvers.py),
read from simulated environments: the addresses every task computes are the
same list, each task finds itself in it, two jobs on one node get different
ports, and what cannot be read is named. SLURM's host lists are checked
against the forms SLURM's documentation shows and against a second expander
written here after SLURM's own parser; the ports against SLURM's reservations
(`srun --resv-ports`) and a real socket holding the port."""

import os
import random
import re
import socket

import pytest

from tf_glp.strategy import cluster, resolvers


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
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("n[01-10]", [f"n{i:02d}" for i in range(1, 11)]),
    ("n[1,3,5-7]", ["n1", "n3", "n5", "n6", "n7"]),
    ("a1,b[1-2],c", ["a1", "b1", "b2", "c"]),
    ("n[8-12]", ["n8", "n9", "n10", "n11", "n12"]),  # the width is the lower bound's as written
    ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
    ("n[001-1000]", [f"n{i:03d}" for i in range(1, 1001)]),
    ("n[2,1],n[1-2]", ["n2", "n1", "n1", "n2"]),  # neither sorted nor made unique, as SLURM's
    ("a1 b2,\tc", ["a1", "b2", "c"]),  # whitespace separates names too
    ("[1-2]", ["1", "2"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert resolvers.expand_hostlist(text) == hosts


# The forms SLURM's documentation shows, with what it says they mean:
# - slurm.conf(5), NODE CONFIGURATION (https://slurm.schedmd.com/slurm.conf.html): "The node range
#   expression can contain one or more pairs of square brackets with a sequence of comma-separated
#   numbers and/or ranges of numbers separated by a "-" (e.g., "linux[0-64,128]", "lx[15,18,32-33]",
#   or "rack[0-63]_blade[0-41]"). Note that the numeric ranges can include one or more leading zeros
#   to indicate the numeric portion has a fixed number of digits (e.g. "linux[0000-1023]")."
# - scontrol(1), `show hostnames` (https://slurm.schedmd.com/scontrol.html): "tux[1-3]" is mapped
#   to "tux1", "tux2" and "tux3".
# - Slurm::Hostlist(3pm), libslurm's Perl binding
#   (https://manpages.ubuntu.com/manpages/noble/man3/Slurm::Hostlist.3pm.html): "one or more
#   hostnames or bracketed hostlists separated by either `,' or whitespace", e.g. "tux[0-5,12,20-25]",
#   "node1,node[2-5,12]".
# - SLURM 23.11's change log (https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-23.11.md):
#   "Allow for a shared suffix to be used with the hostlist format. E.g., "node[0001-0010]-int"."
# - Three brackets: no document shows one; the order is what libslurm does (Note [SLURM's bracket
#   order] in resolvers.py), seen from Debian's libslurm38 (SLURM 22.05.8) through ctypes:
#   slurm_hostlist_create_dims("a[1-2]b[3-4]c[5-6]", 1) then slurm_hostlist_shift until empty.
@pytest.mark.parametrize("text, hosts", [
    ("linux[0-64,128]", [f"linux{i}" for i in [*range(65), 128]]),
    ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
    ("rack[0-63]_blade[0-41]", [f"rack{r}_blade{b}" for r in range(64) for b in range(42)]),
    ("linux[0000-1023]", [f"linux{i:04d}" for i in range(1024)]),
    ("tux[1-3]", ["tux1", "tux2", "tux3"]),
    ("tux[0-5,12,20-25]", [f"tux{i}" for i in [*range(6), 12, *range(20, 26)]]),
    ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),
    ("node1 node[2-3]", ["node1", "node2", "node3"]),
    ("node[0001-0010]-int", [f"node{i:04d}-int" for i in range(1, 11)]),
    ("a[1-2]b[3-4]c[5-6]", ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
])
def test_slurm_host_lists_expand_as_slurm_documents(text, hosts):
    assert resolvers.expand_hostlist(text) == hosts


def _reference_expand(text: str) -> list[str]:
    """A second expander, written after SLURM's C parser (src/common/hostlist.c:
    _next_tok, _hostlist_create_bracketed, _push_range_list) and not after
    expand_hostlist: a name's last bracket is expanded innermost, and what is
    left of the name before it by recursion on its own last bracket."""
    hosts = []
    for token in _reference_tokens(text):
        if "[" not in token:
            hosts.append(token)
            continue
        start = token.rindex("[")
        end = token.index("]", start)
        hosts += _reference_push(token[:start], _reference_numbers(token[start + 1:end]), token[end + 1:])
    return hosts


def _reference_push(prefix: str, numbers: list[str], suffix: str) -> list[str]:
    if "[" not in prefix:
        return [prefix + number + suffix for number in numbers]
    start = prefix.rindex("[")
    end = prefix.index("]", start)
    hosts = []
    for outer in _reference_numbers(prefix[start + 1:end]):
        hosts += _reference_push(prefix[:start] + outer + prefix[end + 1:], numbers, suffix)
    return hosts


def _reference_numbers(inside: str) -> list[str]:
    numbers = []
    for item in inside.split(","):
        bounds = item.split("-")
        for number in range(int(bounds[0]), int(bounds[-1]) + 1):
            numbers.append(str(number).zfill(len(bounds[0])))
    return numbers


def _reference_tokens(text: str) -> list[str]:
    tokens, token, depth = [], "", 0
    for char in text + ",":
        if depth == 0 and char in ", \t\n":
            if token:
                tokens.append(token)
            token = ""
            continue
        depth += (char == "[") - (char == "]")
        token += char
    return tokens


def _random_host_list(rng: random.Random) -> str:
    """A host list in SLURM's grammar: 1-3 names of 0-3 brackets, each of 1-3
    numbers or ranges, zero-padded or not, with text around them."""
    def literal():
        return "".join(rng.choice("abnx-_.0123456789") for _ in range(rng.randrange(3)))

    def item():
        width = rng.choice([1, 1, 2, 3])
        low = rng.randrange(12)
        text = str(low).zfill(width)
        return text if rng.random() < 0.4 else f"{text}-{low + rng.randrange(4)}"

    names = []
    for _ in range(rng.randrange(1, 4)):
        name = rng.choice("abn") + literal()
        for _ in range(rng.randrange(4)):
            name += "[" + ",".join(item() for _ in range(rng.randrange(1, 4))) + "]" + literal()
        names.append(name)
    return rng.choice([",", ", ", " "]).join(names)


def test_slurm_host_lists_expand_as_a_reference_written_after_slurms_parser():
    rng = random.Random(66)
    forms = [_random_host_list(rng) for _ in range(400)]
    assert sum(form.count("[") >= 3 for form in forms) > 20  # several brackets in one name: covered
    for form in forms:
        assert resolvers.expand_hostlist(form) == _reference_expand(form), form


def _compress(hosts: list[str]) -> str:
    """A tiny host-list writer: consecutive names that differ only in their
    last number (of one width) share one bracket; the order is kept."""
    groups = []  # [prefix, width, suffix, [numbers]]
    for host in hosts:
        end = len(host)
        while end and not host[end - 1].isdigit():
            end -= 1
        start = end
        while start and host[start - 1].isdigit():
            start -= 1
        if start == end:
            groups.append([host, 0, "", []])
            continue
        key = [host[:start], end - start, host[end:]]
        if groups and groups[-1][:3] == key:
            groups[-1][3].append(int(host[start:end]))
        else:
            groups.append([*key, [int(host[start:end])]])
    names = []
    for prefix, width, suffix, numbers in groups:
        if not numbers:
            names.append(prefix)
            continue
        runs = [[numbers[0], numbers[0]]]
        for number in numbers[1:]:
            if number == runs[-1][1] + 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        items = [str(a).zfill(width) + ("" if a == b else f"-{b}") for a, b in runs]
        names.append(f"{prefix}[{','.join(items)}]{suffix}")
    return ",".join(names)


def test_slurm_host_lists_round_trip_through_a_compressor():
    rng = random.Random(2)
    for _ in range(300):
        hosts = []
        for _ in range(rng.randrange(1, 30)):
            prefix = rng.choice(["n", "cpu", "rack1-n", "gpu-a", "login"])
            width = rng.choice([1, 2, 4])
            suffix = rng.choice(["", "", "-ib", "x"])
            start = rng.randrange(120)
            hosts += [f"{prefix}{str(n).zfill(width)}{suffix}" for n in range(start, start + rng.randrange(1, 6))]
        if rng.random() < 0.3:
            rng.shuffle(hosts)
        assert resolvers.expand_hostlist(_compress(hosts)) == hosts, _compress(hosts)


@pytest.mark.parametrize("text, message", [
    ("n[1-2", "does not close its last bracket"),
    ("n1-2]", "closes a bracket it did not open at character 4"),
    ("n[1[2]]", "a bracket inside a bracket"),
    ("n[3-1]", "the range '3-1' runs backwards \\(3 > 1\\)"),
    ("n[1-10:2]", "'1-10:2' is not a number or a range 'low-high'"),  # SLURM has no steps
    ("n[a-b]", "'a-b' is not a number"),
    ("n[1-]", "'1-' is not a number"),
    ("n[-2]", "'-2' is not a number"),
    ("n[]", "'' is not a number"),
    ("n[1,]", "'' is not a number"),
    ("n[+1]", "'\\+1' is not a number"),  # SLURM reads it as 01
    ("n[1, 3]", "' 3' is not a number"),  # SLURM reads it as n1, n03
    ("n[0-99999]", "holds more than 65536 numbers"),
    ("a[0-999]b[0-999]", "names more than 65536 hosts"),
    ("", "names no host"),
    ("a,,b", "an empty name before the comma at character 2"),
    (",a", "an empty name before the comma at character 0"),
    ("a,", "ends without a name"),
])
def test_bad_slurm_host_lists_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        resolvers.expand_hostlist(text)


def _use_slurm_env(monkeypatch, **variables):
    """os.environ as srun leaves it for a task with `variables`, nothing of SLURM's else."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "SLURMD_"))]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def _step(rank, node, nodes="n[1-2]", per_node="2(x2)", tasks="4", **extra):
    """srun --nodes=2 --ntasks-per-node=2 of job 77 (step variables)."""
    return dict(SLURM_PROCID=str(rank), SLURM_STEP_NUM_TASKS=tasks, SLURM_JOB_ID="77", SLURM_STEP_NODELIST=nodes,
                SLURM_STEP_TASKS_PER_NODE=per_node, SLURMD_NODENAME=node, **extra)


@pytest.mark.parametrize("reserved, ports", [
    ("12000-12002", [12000, 12001]),  # the form in SLURM's MPI guide; tasks per node + 1, SLURM's default
    ("12007,12000-12001", [12007, 12000]),  # a list/range mix, taken in the order written
    ("12998-12999,12000", [12998, 12999]),
])
def test_slurm_reserved_ports_are_each_tasks_and_every_task_agrees(monkeypatch, reserved, ports):
    # SLURM's MPI guide (https://slurm.schedmd.com/archive/slurm-22.05.0/mpi_guide.html): "The ports
    # reserved on every allocated node will be identified in an environment variable available to the
    # tasks as shown here: SLURM_STEP_RESV_PORTS=12000-12015". SLURM writes the reservation as a
    # ranged list without brackets (src/common/port_mgr.c, _resv_port_alloc).
    expected = [f"n{node}:{port}" for node in (1, 2) for port in ports]
    for rank, node in enumerate(["n1", "n1", "n2", "n2"]):
        _use_slurm_env(monkeypatch, **_step(rank, node, SLURM_STEP_RESV_PORTS=reserved))
        resolver = resolvers.slurm_cluster()
        assert _workers(resolver) == expected
        assert f"Port {ports[rank % 2]} " in resolver.port_origin and "SLURM_STEP_RESV_PORTS" in resolver.port_origin


def test_port_base_overrides_the_reservation(monkeypatch):
    _use_slurm_env(monkeypatch, **_step(0, "n1", SLURM_STEP_RESV_PORTS="12000-12002"))
    assert _workers(resolvers.slurm_cluster(port_base=3000)) == ["n1:3000", "n1:3001", "n2:3000", "n2:3001"]


@pytest.mark.parametrize("reserved, message", [
    ("12000", "SLURM_STEP_RESV_PORTS='12000' reserves 1 ports, but a node runs 2 tasks of this step: run it "
              "with `srun --resv-ports=2` or more, or pass slurm_cluster(port_base=...)"),
    ("12001-12000", "SLURM_STEP_RESV_PORTS='12001-12000': the range '12001-12000' runs backwards"),
    ("12000:2", "SLURM_STEP_RESV_PORTS='12000:2': '12000:2' is not a number"),
    ("0-3", "SLURM_STEP_RESV_PORTS='0-3' must name distinct ports in 1..65535"),
    ("65535-65536", "must name distinct ports in 1..65535"),
    ("12000,12000-12001", "must name distinct ports"),
])
def test_unusable_port_reservations_are_named(monkeypatch, reserved, message):
    _use_slurm_env(monkeypatch, **_step(0, "n1", SLURM_STEP_RESV_PORTS=reserved))
    with pytest.raises(ValueError, match=re.escape(message)):
        resolvers.slurm_cluster()


def test_the_fallback_ports_lie_outside_linuxs_ephemeral_range_one_block_per_job():
    blocks = [set(range(resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (job % resolvers.PORT_BLOCKS),
                        resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (job % resolvers.PORT_BLOCKS + 1)))
              for job in range(resolvers.PORT_BLOCKS)]
    ports = set().union(*blocks)
    assert len(ports) == resolvers.PORT_BLOCKS * resolvers.PORTS_PER_JOB  # jobs 0..140: no two share a port
    assert min(ports) >= 61000 and max(ports) <= 65535  # not 32768-60999 (Linux's default ephemeral ports)
    for job in (0, 140, 141, 4242, 10**9 + 7):
        env = _slurm(0, "cpu07", SLURM_JOB_ID=str(job))
        base = resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (job % resolvers.PORT_BLOCKS)
        assert _workers(resolvers.slurm_cluster(environ=env))[:2] == [f"cpu07:{base}", f"cpu07:{base + 1}"]


def test_more_tasks_on_a_node_than_the_fallback_block_holds_are_named(monkeypatch):
    _use_slurm_env(monkeypatch, **_step(0, "n1", per_node="33(x2)", tasks="66"))
    with pytest.raises(ValueError, match=re.escape("33 tasks on one node, but a job's fallback block holds 32 "
                                                   "ports: run the step with `srun --resv-ports=33`, or pass "
                                                   "slurm_cluster(port_base=...)")):
        resolvers.slurm_cluster()
    monkeypatch.setenv("SLURM_STEP_RESV_PORTS", "12000-12040")  # a reservation (srun --resv-ports=34): it fits
    assert _workers(resolvers.slurm_cluster())[32] == "n1:12032"


def _held_port_message(resolver) -> str:
    with pytest.raises(RuntimeError) as error:
        with cluster.starting(resolver):
            pytest.fail("the port check let a held port pass")
    return str(error.value)


def _one_task(**extra):
    return dict(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="1",
                SLURMD_NODENAME="localhost", **extra)


def test_a_held_fallback_port_is_named_with_its_job_and_the_fix(monkeypatch):
    for job in range(1000, 1000 + resolvers.PORT_BLOCKS):  # a job id whose block's first port is free here
        port = resolvers.FIRST_PORT + resolvers.PORTS_PER_JOB * (job % resolvers.PORT_BLOCKS)
        busy = socket.socket()
        try:
            busy.bind(("", port))
            break
        except OSError:
            busy.close()
    else:
        pytest.skip("every fallback block's first port is in use here")
    with busy:
        busy.listen()
        _use_slurm_env(monkeypatch, **_one_task(SLURM_JOB_ID=str(job)))
        message = _held_port_message(resolvers.slurm_cluster())
    assert f"this worker's address localhost:{port} cannot be used: port {port} cannot be bound" in message
    assert (f"slurm_cluster's fallback block for SLURM job {job}, 61000 + 32 x ({job} mod 141)" in message
            and "Run the step with `srun --resv-ports=1` (SLURM then reserves" in message
            and "slurm_cluster(port_base=...)" in message)


def test_a_held_reserved_port_is_named_with_the_reservation_and_the_fix(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _use_slurm_env(monkeypatch, **_one_task(SLURM_JOB_ID="77", SLURM_STEP_RESV_PORTS=f"{port}-{port + 1}"))
        message = _held_port_message(resolvers.slurm_cluster())
    assert f"port {port} cannot be bound" in message
    assert (f"of SLURM_STEP_RESV_PORTS='{port}-{port + 1}', the ports SLURM reserved for this step of SLURM job 77"
            in message and "MpiParams=ports" in message and "slurm_cluster(port_base=...)" in message)


def test_a_held_port_base_is_named_with_the_fix(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _use_slurm_env(monkeypatch, **_one_task(SLURM_JOB_ID="77"))
        message = _held_port_message(resolvers.slurm_cluster(port_base=port))
    assert f"port {port} cannot be bound" in message
    assert (f"port_base={port} + 0 (the task's index on its node), given to slurm_cluster() of SLURM job 77" in message
            and "Pass another port_base, or leave it out and run the step with `srun --resv-ports=1`" in message)


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


def test_strategy_reads_the_host_list_where_no_tf_config_is_set(monkeypatch):
    # tf_glp.Strategy() with no resolver (cluster.resolve_cluster): an Indexed
    # Job's pod needs no change to the script; TF_CONFIG, when set, wins.
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name in resolvers.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_GLP_WORKER_HOSTS", "train-{index}.train:2222")
    monkeypatch.setenv("TF_GLP_WORKERS", "2")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    resolver = cluster.resolve_cluster()
    assert _workers(resolver) == ["train-0.train:2222", "train-1.train:2222"] and resolver.task_id == 1
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}')
    assert _workers(cluster.resolve_cluster()) == ["h:1"]
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.delenv("TF_GLP_WORKER_HOSTS")
    assert cluster.resolve_cluster() is None


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
