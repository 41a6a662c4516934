"""tools/claims.py: each kind of drift, planted in a Markdown file beside a
records folder and a code tree of its own, is reported; a clean file passes.
The collected test ids are given, so no pytest collection runs here."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tools_claims", ROOT / "tools" / "claims.py")
claims = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = claims  # its dataclasses look their module up there
_spec.loader.exec_module(claims)

TEST_IDS = {
    "tests/strategy/test_one.py::test_a",
    "tests/strategy/test_one.py::test_b[host]",
    "tests/strategy/test_one.py::test_b[replicas]",
    "tests/strategy/test_one.py::TestErrors::test_c",
    "tests/strategy/test_two.py::test_cap_threads",
    "tests/test_top.py::test_d",
}
RECORD = {"id": "bench#1", "benchmark": "bench", "tree_changed": True, "note": "2.58x in a string is not a figure",
          "ratios": {"long_fit": 1.311, "paired": {"values": [1.6354, 0.9396, 1.771], "min": 0.9396, "max": 1.771}}}


@pytest.fixture
def check(tmp_path):
    """Writes the Markdown text to a file and returns the checker's findings
    as (line, kind, detail)."""
    records = tmp_path / "records"
    records.mkdir()
    (records / "bench.jsonl").write_text(json.dumps(RECORD) + "\n")
    code = tmp_path / "code"
    (code / "tf_glp" / "strategy").mkdir(parents=True)
    (code / "tf_glp" / "strategy" / "cluster.py").write_text("HEARTBEAT_TIMEOUT_S = 60\n")

    def run(text: str) -> list[tuple[int, str, str]]:
        doc = tmp_path / "doc.md"
        doc.write_text(text)
        findings = claims.check([str(doc)], records_dir=records, test_ids=TEST_IDS, code_root=code)
        return [(finding.line, finding.kind, finding.detail) for finding in findings]

    return run


CLEAN = """\
# A page measured 9.9x (headings are titles, not claims)

Bitwise like plain Keras (`tests/strategy/test_one.py::test_a`, `::test_b`, `::TestErrors::test_c`).
Tested on both concepts (`strategy/test_one.py::test_b[host]`, `[replicas]`); the file as a whole:
`strategy/test_one.py`, `tests/strategy/test_one.py`, `tests/strategy/test_one.py`, `test_two.py::test_cap_*`.
A sentence without a claim needs no citation. Measured at the top level: `test_top.py::test_d`.

| measured | backed by |
|---|---|
| 1.31x on the long fit, 0.94x-1.77x paired, 1.6-1.8x rounded | `bench#1` |
| dead workers fail the others within 60 s | code: `cluster.HEARTBEAT_TIMEOUT_S` |
| the rest of the cluster within 60 s | `strategy/cluster.py` (code) |
| 1.9x on a GPU | unbacked: a GPU run |

- one long fit: 1.3x, 1.311x and 1.6354x
  by the medians (`bench#1`)
- not tested, never measured, and 32x32x3 images: nothing claimed
- a word named, not claimed: "bitwise" means every bit equal

```bash
python bench.py   # 1.5x faster, tested
```
"""


def test_a_clean_file_passes(check):
    assert check(CLEAN) == []


@pytest.mark.parametrize("citation, detail", [
    ("`strategy/test_one.py::test_gone`", "tests/strategy/test_one.py::test_gone"),
    ("`strategy/test_one.py::test_a`, `::test_gone`", "tests/strategy/test_one.py::test_gone"),
    ("`strategy/test_one.py::test_b[other]`", "tests/strategy/test_one.py::test_b[other]"),
    ("`strategy/test_one.py::test_b[host]`, `[other]`", "tests/strategy/test_one.py::test_b[other]"),
    ("`test_one.py::test_a`", "tests/test_one.py::test_a"),  # not under strategy/ without a file before it
    ("`strategy/test_gone.py`", "tests/strategy/test_gone.py"),
    ("`::test_a`", "a continuation with no test citation before it"),
])
def test_a_missing_test_is_found(check, citation, detail):
    assert check(f"Some text.\nTested bitwise ({citation}).\n") == [(2, "missing test", detail)]


def test_a_missing_record_is_found(check):
    assert check("Faster (`bench#2`).\n\n| 1.31x | `other#1` |\n") == [
        (1, "missing record", "bench#2"), (3, "missing record", "other#1")]


@pytest.mark.parametrize("ratio, found", [
    ("1.32x", True), ("1.4x", True), ("2.58x", True),  # 2.58 is only in a string of the record
    ("1.31x", False), ("1.3x", False), ("1.311x", False), ("1.77x", False),
])
def test_a_changed_number_is_found(check, ratio, found):
    findings = check(f"Per step\n{ratio} plain Keras (`bench#1`).\n")
    assert findings == ([(2, "number not in record", f"{ratio} in bench#1")] if found else [])


@pytest.mark.parametrize("written, found", [
    ("0.94x-1.78x", True),  # wider than the record's values
    ("0.95x-1.77x", True),  # narrower
    ("0.9-1.9x", True),     # wider, at one decimal
    ("0.94x-1.77x", False), ("0.9-1.8x", False), ("1.31x-1.64x", False),
])
def test_a_range_wider_or_narrower_than_the_records_is_found(check, written, found):
    findings = check(f"- paired: {written} (`bench#1`)\n")
    assert findings == ([(1, "range not in record", f"{written} in bench#1")] if found else [])


@pytest.mark.parametrize("claim, shape", [
    ("1.31x faster", "1.31x"), ("18% less time", "18%"), ("about 0.2 s", "0.2 s"), ("91 GB/s", "91 GB/s"),
    ("12 ms per step", "12 ms"), ("bitwise the same", "bitwise"), ("tested on two workers", "tested"),
    ("Measured once", "Measured"), ('"bitwise equal" with every setting', "bitwise"),
])
def test_an_uncited_claim_is_found(check, claim, shape):
    # A citation covers its own sentence only; the finding names the claim's line.
    text = f"A sentence with a citation, 1.31x (`bench#1`). And one with a claim:\n{claim}.\n"
    assert check(text) == [(2, "uncited claim", shape)]


def test_an_uncited_claim_in_a_table_row_or_list_item_is_found(check):
    text = "| model | ratio |\n|---|---|\n| wide MLP | 1.52x |\n\n- the cold fit: 0.35x\n"
    assert check(text) == [(3, "uncited claim", "1.52x"), (5, "uncited claim", "0.35x")]


def test_a_missing_code_citation_is_found(check):
    text = ("Within 60 s (code: `cluster.HEARTBEAT_GONE`).\n"
            "Within 60 s (`strategy/gone.py` (code)).\n")
    assert check(text) == [(1, "missing code", "cluster.HEARTBEAT_GONE"), (2, "missing code", "strategy/gone.py")]


def test_main_prints_one_line_per_finding_and_fails(tmp_path, monkeypatch, capsys):
    records = tmp_path / "records"
    records.mkdir()
    (records / "bench.jsonl").write_text(json.dumps(RECORD) + "\n")
    monkeypatch.setattr(claims, "RECORDS_DIR", records)
    monkeypatch.setattr(claims, "collect_test_ids", lambda: TEST_IDS)
    clean, drifted = tmp_path / "clean.md", tmp_path / "drifted.md"
    clean.write_text("1.31x (`bench#1`).\n")
    drifted.write_text("Intro.\n\n1.32x (`bench#1`), bitwise (`strategy/test_one.py::test_gone`).\n")

    assert claims.main([str(clean)]) == 0
    assert claims.main([str(clean), str(drifted)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f'{drifted}:3: missing test: tests/strategy/test_one.py::test_gone | '
        '"1.32x (`bench#1`), bitwise (`strategy/test_one.py::test_gone`)."',
        f'{drifted}:3: number not in record: 1.32x in bench#1 | '
        '"1.32x (`bench#1`), bitwise (`strategy/test_one.py::test_gone`)."',
    ]
