"""Claims as data: checks that the docs' numbers and "tested"s cite evidence
that exists and says what they say.

    python tools/claims.py [FILE.md ...]     # default: CHECKED_FILES

Prints one line per finding, `file:line: kind: detail | "the text"`, and
exits 1 if there is any (2 if pytest cannot collect the tests).

Units. A Markdown file is cut into units: each table row, each list item
(with its indented continuation lines; an unindented line ends the item),
and each sentence of a paragraph (a sentence ends at `.`, `!` or `?`
followed by whitespace and a capital, a backtick, a quote, `*` or `[`; not
inside a code span, not after "e.g.", "i.e.", "vs." or "cf."). Headings,
tables' header rows and fenced code blocks are not read. A citation covers
its own unit only.

Citations (each a whole code span, in backticks):
- a test: `tests/strategy/test_x.py::test_name`, with or without the
  `tests/` prefix (paths are under tests/), with classes
  (`test_x.py::TestErrors::test_name`), a parameter (`...::test_name[host]`;
  `…` in it matches anything) or a `*` glob (`...::test_gpu_cap_*`).
  Continuing the unit's previous test citation: `::test_other` (its file
  and class, else its file), `[other]` (its test, another parameter), and
  a bare `test_y.py` after `tests/strategy/test_x.py` may be
  tests/strategy/test_y.py. A test file alone: `strategy/test_x.py` (some
  test in it collected). Only files named test_*.py are test citations
  (Keras' `model_test.py::...` is not).
- a record: `families#1`, the record with that "id" in
  benchmarks/records/families.jsonl (benchmarks/records.py).
- code: "code: `name`" or "`name` (code)". `name` is a path (has a `/` or
  ends in .py: it must exist under the repository or tf_glp/) or a
  dotted name (`cluster.DEFAULT_HEARTBEAT_TIMEOUT_S`: its last part must occur as
  a word in tf_glp/**/cluster.py; `MAX_TIMED_PARAMETERS`: in any tf_glp
  file).

What is checked:
1. missing test: a test citation names a test (or test file) that
   `pytest --collect-only` does not list (collected once per run, nothing
   cached; with --ray so that tests/ray counts). A citation without a
   parameter matches every parametrization.
2. missing record: a record citation names no record.
3. number not in record / range not in record: in a unit citing exactly
   one record, every ratio `1.42x` must equal a number of that record
   rounded to the printed decimals (every JSON number anywhere in it,
   nested or in lists; not numbers written inside its strings), and each
   end of a range `1.0-1.9x` / `1.00x-1.90x` must. A range is checked end
   by end: that its ends are the min and max of one set of values is not.
4. uncited claim: a unit with a claim-shaped token and no citation (test,
   test file, record or code, found or not) and without the word
   "unbacked" (the claims.md way of saying there is no evidence yet).
   Claim-shaped: a number followed by x, %, ms, s or GB/s (`1.31x`, `18%`,
   `0.2 s`, `91 GB/s`), or the words "bitwise", "tested", "measured" (not
   after "not " or "never ", nor named in double quotes as here). Code
   spans and link targets are not read.
5. missing code: a code citation whose file or name is not found.

Not checked: numbers other than ratios against a record (ms, s, %); which
field of the record a ratio comes from (any number of it will do, so a
large record lets a wrong ratio pass by chance); any number in a unit
citing a test, code, or two records; whether a test asserts what the text
says; numbers and words in headings; "R: section" references to
benchmarks/RESULTS.md, which are not citations here.
"""

from __future__ import annotations

import argparse
import decimal
import fnmatch
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS_DIR = ROOT / "benchmarks" / "records"

# The files CI holds to the rules above: those that pass them. A file joins
# when its findings are fixed (run `tools/dev.sh claims docs/x.md` to see them).
CHECKED_FILES: list[str] = ["README.md", "docs/building.md", "docs/compare.md", "docs/numerics.md",
                             "docs/profiler.md", "docs/scaling-out.md"]

_CODE_SPAN = re.compile(r"`([^`]+)`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_TEST = re.compile(r"(?:tests/)?((?:[\w.-]+/)*test_\w*\.py)((?:::[\w*]+)*)(\[[^\]]*\])?")
_CONTINUATION = re.compile(r"((?:::[\w*]+)*)(\[[^\]]*\])?")
_RECORD = re.compile(r"[A-Za-z][\w-]*#\d+")
_CODE_CITATION = re.compile(r"\bcode:\s*`([^`]+)`|`([^`]+)`\s*\(code\)")
# A ratio range first (`1.0-1.9x`, `1.00x-1.90x`), then a single ratio; the
# lookarounds keep `32x32x3` and parts of longer numbers out.
_RANGE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x?\s?[-\u2013]\s?(\d+(?:\.\d+)?)x(?![\w])")
_RATIO = re.compile(r"(?<![\w.\-\u2013])(\d+(?:\.\d+)?)x(?![\w])")
_CLAIM = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:x|\s?(?:GB/s|ms|%|s))(?![\w/])"
                    r"|(?<!not )(?<!never )\b(?:bitwise|tested|measured)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[A-Z`\"*\[])")
_ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "cf.")
_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s")


@dataclass(frozen=True)
class Unit:
    path: str
    line: int  # the line the unit starts on
    text: str  # its lines joined by "\n"

    def line_of(self, position: int) -> int:
        return self.line + self.text.count("\n", 0, position)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    detail: str
    text: str

    def __str__(self) -> str:
        text = " ".join(self.text.split())
        text = text if len(text) <= 160 else text[:157] + "..."
        return f'{self.path}:{self.line}: {self.kind}: {self.detail} | "{text}"'


def units(path: str, text: str) -> list[Unit]:
    """The file cut into table rows, list items and sentences."""
    found: list[Unit] = []
    block: list[tuple[int, str]] = []  # (line number, line) of the paragraph or item being read
    block_is_item = False
    in_fence = False

    def flush() -> None:
        nonlocal block
        if block:
            joined = "\n".join(line for _, line in block)
            unit = Unit(path, block[0][0], joined)
            found.extend([unit] if block_is_item else _sentences(unit))
        block = []

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            flush()
            in_fence = not in_fence
        elif in_fence:
            continue
        elif not stripped:
            flush()
        elif stripped.startswith("|"):
            flush()
            if re.fullmatch(r"[|:\-\s]+", stripped):
                # The |---| line: the row above is the header, column titles, not claims.
                if found and found[-1].line == number - 1:
                    found.pop()
            else:
                found.append(Unit(path, number, line))
        elif stripped.startswith("#"):
            flush()  # a heading: a title, not a claim
        elif _LIST_ITEM.match(line):
            flush()
            block, block_is_item = [(number, line)], True
        elif block_is_item and block and not line[0].isspace():
            # An unindented line after an item starts a paragraph: the
            # writers mean one, even where Markdown would continue the item.
            flush()
            block, block_is_item = [(number, line)], False
        else:
            if not block:
                block_is_item = False
            block.append((number, line))
    flush()
    return found


def _sentences(paragraph: Unit) -> list[Unit]:
    text = paragraph.text
    code = [match.span() for match in _CODE_SPAN.finditer(text)]
    cuts = [0]
    for match in _SENTENCE_END.finditer(text):
        inside_code = any(start < match.start() < end for start, end in code)
        word = text[:match.start() + 1].rsplit(None, 1)[-1]
        if not inside_code and not word.lower().endswith(_ABBREVIATIONS):
            cuts.append(match.end())
    cuts.append(len(text))
    return [Unit(paragraph.path, paragraph.line_of(start), text[start:end])
            for start, end in zip(cuts, cuts[1:]) if text[start:end].strip()]


def load_records(records_dir: Path) -> dict[str, dict]:
    """Every record under records_dir by its "id"."""
    records = {}
    for path in sorted(Path(records_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records


def _numbers(value) -> list[float]:
    if isinstance(value, bool):  # a bool is an int to Python, not a figure
        return []
    if isinstance(value, (int, float)):
        return [value]
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [number for child in children for number in _numbers(child)]


def _printed_in(printed: str, numbers: list[float]) -> bool:
    """Whether some number rounds to `printed` at its decimals (half up or half even)."""
    target = decimal.Decimal(printed)
    step = decimal.Decimal(1).scaleb(target.as_tuple().exponent)
    for number in numbers:
        exact = decimal.Decimal(repr(number))
        if target in (exact.quantize(step, decimal.ROUND_HALF_UP), exact.quantize(step, decimal.ROUND_HALF_EVEN)):
            return True
    return False


def _test_citations(unit: Unit, collected_files: set[str]) -> list[tuple[int, list[str]]]:
    """Each test citation of the unit: its position and the node ids it may
    mean, most likely first (none: a continuation with nothing to continue)."""
    citations = []
    file, parts_before = "", []  # the last citation's file and its ::parts
    for span in _CODE_SPAN.finditer(unit.text):
        content = span.group(1).strip()
        test, continuation = _TEST.fullmatch(content), _CONTINUATION.fullmatch(content)
        if test:
            name, parts, parameter = test.group(1), test.group(2), test.group(3) or ""
            files = [f"tests/{name}"]
            if "/" not in name and "/" in file:
                # `tests/strategy/test_a.py`, `test_b.py`: test_b.py beside test_a.py.
                files.append(f"{file.rsplit('/', 1)[0]}/{name}")
            file = next((f for f in files if f in collected_files), files[0])
            parts_before = parts.split("::")[1:]
            citations.append((span.start(), [f + parts + parameter for f in files]))
        elif continuation and (continuation.group(1) or continuation.group(2) and parts_before):
            parts, parameter = continuation.group(1), continuation.group(2) or ""
            if not file:
                citations.append((span.start(), []))
                continue
            if not parts:  # `[other]`: the test before, another parameter
                parts = "".join(f"::{part}" for part in parts_before)
            # `::b` after `file::Class::a` is file::Class::b or file::b.
            prefix = "".join(f"::{part}" for part in parts_before[:-1])
            citations.append((span.start(), [file + prefix + parts + parameter, file + parts + parameter]))
    return citations


def _test_found(node_id: str, test_ids: set[str], collected_files: set[str]) -> bool:
    """Whether pytest collected `node_id`: a file (some test in it), a test
    (any parameter), or a test with a parameter; `*`, and `…` in a
    parameter, match anything."""
    base, bracket, parameter = node_id.partition("[")
    if "::" not in base:
        return base in collected_files
    parameter = parameter[:-1].replace("…", "*").replace("...", "*")
    for collected in test_ids:
        collected_base, _, collected_parameter = collected.partition("[")
        if fnmatch.fnmatchcase(collected_base, base) and (
                not bracket or fnmatch.fnmatchcase(collected_parameter[:-1], parameter)):
            return True
    return False


def _code_found(name: str, code_root: Path) -> bool:
    package = code_root / "tf_glp"
    if "/" in name or name.endswith(".py"):
        return (code_root / name).exists() or (package / name).exists()
    *module, word = name.split(".")
    files = [path for path in package.rglob("*.py")
             if not module or path.stem == module[-1] or path.parent.name == module[-1]]
    pattern = re.compile(rf"\b{re.escape(word)}\b")
    return any(pattern.search(path.read_text()) for path in files)


def check(files: list[str], *, records_dir: Path, test_ids: set[str], code_root: Path = ROOT) -> list[Finding]:
    """The findings in `files` (Markdown paths), against the records under
    `records_dir`, the node ids `test_ids` pytest collects
    ("tests/strategy/test_x.py::test_name[param]") and the code under
    `code_root`."""
    records = load_records(records_dir)
    collected_files = {node_id.split("::")[0] for node_id in test_ids}
    findings: list[Finding] = []
    for path in files:
        for unit in units(path, Path(path).read_text()):
            findings += [Finding(path, unit.line_of(position), kind, detail, unit.text)
                         for position, kind, detail in _check_unit(unit, records, test_ids, collected_files, code_root)]
    return findings


def _check_unit(unit: Unit, records: dict[str, dict], test_ids: set[str], collected_files: set[str],
                code_root: Path) -> list[tuple[int, str, str]]:
    """The unit's findings: (position in its text, kind, detail)."""
    found = []
    cited = False  # by anything, found or not: a broken citation is reported as such, not as none
    for position, candidates in _test_citations(unit, collected_files):
        cited = True
        if not candidates:
            found.append((position, "missing test", "a continuation with no test citation before it"))
        elif not any(_test_found(candidate, test_ids, collected_files) for candidate in candidates):
            found.append((position, "missing test", candidates[0]))

    cited_records = set()
    for span in _CODE_SPAN.finditer(unit.text):
        if _RECORD.fullmatch(span.group(1)):
            cited = True
            if span.group(1) in records:
                cited_records.add(span.group(1))
            else:
                found.append((span.start(), "missing record", span.group(1)))

    for match in _CODE_CITATION.finditer(unit.text):
        cited = True
        name = (match.group(1) or match.group(2)).strip()
        if not _code_found(name, code_root):
            found.append((match.start(), "missing code", name))

    # What the prose says: code spans and link targets blanked out (same
    # length, so that positions still give lines).
    def blank(match: re.Match) -> str:
        return " " * len(match.group())

    prose = _LINK_TARGET.sub(blank, _CODE_SPAN.sub(blank, unit.text))

    if len(cited_records) == 1:  # with two, which number comes from which is not written
        record_id = next(iter(cited_records))
        numbers = _numbers(records[record_id])
        for match in _RANGE.finditer(prose):
            if not all(_printed_in(end, numbers) for end in match.groups()):
                found.append((match.start(), "range not in record", f"{match.group().strip()} in {record_id}"))
        for match in _RATIO.finditer(_RANGE.sub(blank, prose)):
            if not _printed_in(match.group(1), numbers):
                found.append((match.start(), "number not in record", f"{match.group()} in {record_id}"))

    # A claim word in double quotes is named, not claimed: '"bitwise" means ...'.
    claims = [claim for claim in _CLAIM.finditer(prose)
              if not prose[claim.start() - 1:claim.start()] == prose[claim.end():claim.end() + 1] == '"']
    if claims and not cited and "unbacked" not in unit.text.lower():
        shown = [claim.group() for claim in claims[:6]] + ([f"{len(claims) - 6} more"] if len(claims) > 6 else [])
        found.append((claims[0].start(), "uncited claim", ", ".join(shown)))
    return found


def collect_test_ids(root: Path = ROOT) -> set[str]:
    """The node ids pytest collects, tests/ray included (--ray: the suite
    leaves it out, tools/dev.sh test runs it as a step of its own)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--ray"],
        cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        # Not a finding per citation: every one of a file that failed to import would be "missing".
        print(f"tools/claims.py: pytest could not collect the tests (exit {result.returncode}):\n"
              f"{result.stdout[-3000:]}{result.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(2)
    return {line.strip() for line in result.stdout.splitlines() if "::" in line and not line.startswith(" ")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: CHECKED_FILES)")
    args = parser.parse_args(argv)
    # Paths as given (relative to the working directory), CHECKED_FILES' from the root.
    files = args.files or [os.path.relpath(ROOT / f) for f in CHECKED_FILES]
    if not files:
        print("tools/claims.py: CHECKED_FILES is empty: nothing to check")
        return 0
    findings = check(files, records_dir=RECORDS_DIR, test_ids=collect_test_ids())
    for finding in findings:
        print(finding)
    print(f"tools/claims.py: {len(findings)} finding(s) in {len(files)} file(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
