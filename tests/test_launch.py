"""tf_glp.launch: workers on free local ports with their own TF_CONFIG,
prefixed output, the first failure's status, the others stopped."""

import io
import json
import re
import sys
import textwrap
import time

import pytest

from tf_glp import launch


def _script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_workers_get_their_own_tf_config_and_prefixed_output(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys
        config = json.loads(os.environ["TF_CONFIG"])
        print(json.dumps({"config": config, "replicas": os.environ.get("TF_GLP_CPU_REPLICAS"), "args": sys.argv[1:]}))
        print("to stderr", file=sys.stderr)
    """)
    out, err = io.StringIO(), io.StringIO()
    status = launch.launch(2, [sys.executable, script, "--flag", "x"], cpu_replicas=3, out=out, err=err)
    assert status == 0
    seen = {}
    for line in out.getvalue().splitlines():
        match = re.fullmatch(r"\[worker (\d)\] (.*)", line)
        assert match, line
        seen[int(match.group(1))] = json.loads(match.group(2))
    assert sorted(seen) == [0, 1]
    clusters = {json.dumps(s["config"]["cluster"]) for s in seen.values()}
    assert len(clusters) == 1
    workers = seen[0]["config"]["cluster"]["worker"]
    assert len(workers) == 2 and len(set(workers)) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
    assert [seen[i]["config"]["task"] for i in (0, 1)] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert all(s["replicas"] == "3" and s["args"] == ["--flag", "x"] for s in seen.values())
    assert sorted(err.getvalue().splitlines()) == ["[worker 0] to stderr", "[worker 1] to stderr"]


def test_first_failure_stops_the_others_and_sets_the_status(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        if index == 1:
            print("failing", flush=True)
            sys.exit(3)
        time.sleep(60)
    """)
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    status = launch.launch(2, [sys.executable, script], out=out, err=err)
    assert status == 3
    assert time.monotonic() - start < 30  # the sleeping worker was stopped
    assert "[worker 1] failing" in out.getvalue()
    assert "[launch] worker 1 exited with status 3; stopping the others" in err.getvalue()


def test_bad_arguments(tmp_path, capsys):
    script = _script(tmp_path, "print('hi')\n")
    with pytest.raises(SystemExit):
        launch.main(["--workers", "0", script])
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--workers", "2", "--cpu-replicas", "0", script])
    assert "--cpu-replicas must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--workers", "2", str(tmp_path / "missing.py")])
    assert "no such script" in capsys.readouterr().err


def test_free_ports_are_distinct():
    ports = launch.free_ports(4)
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)
