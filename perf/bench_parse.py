"""Parse cost: µs per statement for a mix of the reference document's DDL.

    python perf/bench_parse.py -o parse.json       # pyperf, several processes
    python perf/bench_parse.py --fast              # a quicker, rougher run

Side by side in the same run: the mix through ``parse_script`` (LALR with the
embedded transformer, parameter typing included), and Lark's lexer alone
over the same text, the floor any Lark-based parser pays.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyperf

from resgroups.sql.parser import _parser, parse_script

HERE = Path(__file__).resolve().parent
MIX = [
    block.strip()
    for block in re.split(r"\n\s*\n", (HERE.parent / "tests" / "seed_statements.sql").read_text())
    if block.strip() and not block.lstrip().startswith("--")
] + [
    "SELECT name, cpu_weight FROM resource_groups() WHERE cpu_weight > 10 ORDER BY 2 DESC LIMIT 3",
    "SELECT current_resource_group()",
]


def parse_mix(loops: int) -> float:
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        for sql in MIX:
            parse_script(sql)
    return (pyperf.perf_counter() - t0) / len(MIX)


def lex_mix(loops: int) -> float:
    lark = _parser()
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        for sql in MIX:
            for _tok in lark.lex(sql):
                pass
    return (pyperf.perf_counter() - t0) / len(MIX)


if __name__ == "__main__":
    runner = pyperf.Runner()
    runner.metadata["statements_in_mix"] = str(len(MIX))
    runner.bench_time_func("parse_statement", parse_mix)
    runner.bench_time_func("lex_statement", lex_mix)
