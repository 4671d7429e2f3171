"""Strip notebook outputs except on cells marked ``# NBVAL_CHECK_OUTPUT`` (nbval compares those).

    python scripts/nb_clean.py notebooks/*.ipynb          # rewrite in place
    python scripts/nb_clean.py --check notebooks/*.ipynb  # exit 1 if a notebook needs cleaning

Run a notebook first (jupyter nbconvert --execute --to notebook --inplace NB) so the checked
cells carry the outputs nbval will compare against.
"""

from __future__ import annotations

import json
import sys


def clean(nb: dict) -> dict:
    count = 0
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "NBVAL_CHECK_OUTPUT" not in source:
            cell["outputs"] = []
        # nbval refuses a cell with outputs but no execution count ("unrun reference cell")
        count += bool(cell["outputs"])
        cell["execution_count"] = count if cell["outputs"] else None
        for out in cell["outputs"]:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = cell["execution_count"]
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def main(argv: list[str]) -> int:
    check = "--check" in argv
    dirty = []
    for path in (a for a in argv if a != "--check"):
        with open(path) as f:
            text = f.read()
        new = json.dumps(clean(json.loads(text)), indent=1, ensure_ascii=False) + "\n"
        if new != text:
            dirty.append(path)
            if not check:
                with open(path, "w") as f:
                    f.write(new)
    if check and dirty:
        print("notebooks with outputs to strip:", *dirty, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
