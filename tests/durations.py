"""Where each cell of tests/run.sh spends its time: its slowest modules.

``python -m tests.durations CELL JUNIT_XML`` prints one line: the cell's test
time and its five slowest modules, from the JUnit XML file pytest wrote
(``--junitxml``). tests/run.sh prints it for every cell, so that the cells can
be kept balanced (tests/cells.py says which modules run where) with figures
from the same run.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def slowest(path: str, n: int = 5) -> tuple[float, list[tuple[str, float]]]:
    """The file's total test time and its ``n`` slowest modules, in seconds."""
    by_module: Counter[str] = Counter()
    for case in ET.parse(path).iter("testcase"):
        # classname is the dotted module path, plus the class for tests in one.
        parts = case.get("classname", "").split(".")
        while len(parts) > 1 and parts[-1][:1].isupper():
            parts.pop()
        module = ".".join(parts).removeprefix("tests.")
        by_module[module] += float(case.get("time") or 0)
    return sum(by_module.values()), by_module.most_common(n)


def main(cell: str, path: str) -> None:
    try:
        total, top = slowest(path)
    except (OSError, ET.ParseError) as exc:
        print(f"{cell}: no timings ({exc})")
        return
    if not top:
        print(f"{cell}: no tests ran")
        return
    modules = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in top)
    print(f"{cell}: {total:.0f} s in tests; slowest modules: {modules}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
