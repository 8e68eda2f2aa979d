#!/usr/bin/env python3
"""Compares the interop table a run printed with the one in docs/COMPATIBILITY.md.

    check_table.py DOC RUN_TABLE

DOC's table is the first markdown table (a line starting "| case |" and the lines starting "|"
after it) below the heading "## Live interop". The two must have the same rows in the same order
with the same cells, so the document can only show what the suite runs and what it found. One
difference is allowed: a cell the run marks "known third-party bug" (lib.sh's KNOWN_THIRD_PARTY:
not a failure of the suite) matches a documented "pass", and is named on stdout. Exit 0 when they
match; 1 with a unified diff when not; 2 when DOC has no such table.
"""
import difflib
import sys

KNOWN = "known third-party bug"


def doc_table(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    in_section = False
    for i, line in enumerate(lines):
        if line.startswith("## "):
            in_section = line.startswith("## Live interop")
        elif in_section and line.startswith("| case |"):
            table = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                table.append(row.rstrip())
            return table
    return None


def cells(row):
    return [c.strip() for c in row.strip().strip("|").split("|")]


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    doc = doc_table(sys.argv[1])
    if doc is None:
        print(f"{sys.argv[1]}: no interop table under '## Live interop'")
        return 2
    run = [l.rstrip() for l in open(sys.argv[2], encoding="utf-8").read().splitlines() if l.strip()]
    # Where a run's "known third-party bug" stands against a documented "pass", compare as "pass".
    doc_rows = {cells(r)[0]: cells(r) for r in doc}
    header = cells(doc[0])
    compared = []
    for row in run:
        c = cells(row)
        want = doc_rows.get(c[0])
        if want and len(want) == len(c):
            for j, cell in enumerate(c):
                if cell == KNOWN and want[j] == "pass":
                    print(f"note: '{c[0]}' {header[j]}: {KNOWN} this run, pass in the document")
                    c[j] = "pass"
        compared.append("| " + " | ".join(c) + " |")
    doc_norm = ["| " + " | ".join(cells(r)) + " |" for r in doc]
    if compared == doc_norm:
        return 0
    print(f"the interop table differs from {sys.argv[1]} (-document, +this run):")
    sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(doc_norm, compared, "document", "run", lineterm="", n=1))
    return 1


if __name__ == "__main__":
    sys.exit(main())
