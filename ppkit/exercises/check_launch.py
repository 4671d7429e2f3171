"""Exercises about what each rank is told, checked in the kernel in well under a second.

    check_my_share(fn)           lesson 0: which items of the work rank r of world_size handles
    check_slurm_to_torchrun(fn)  lesson 7: SLURM's variables under torchrun's names

Both return a ``CheckReport`` when every case is right and raise ``ExerciseFailed`` otherwise,
naming the case (world size and rank, or the SLURM variables), what was expected and what came back.
"""

from __future__ import annotations

import operator

from ppkit.checks import check_callable
from ppkit.cluster.tools.env import TORCHRUN_VARS, read_launch_env
from ppkit.exercises.report import CheckReport, raise_or_report

# -- lesson 0: every rank takes its share -----------------------------------------------------------

SHARE_WORLD_SIZES = (1, 2, 3, 4, 6)
SHARE_NUM_ITEMS = (0, 1, 4, 10, 13)  # fewer items than ranks, a multiple of 4, and 13 (divides by none)


def _as_item(item):
    """An int for anything int-like (an int, a 0-d integer tensor, numpy's ints); else as it is."""
    try:
        return operator.index(item)
    except TypeError:
        return item


def _as_items(got) -> list | None:
    """The item numbers in ``got``, or None if it is no list of them (a string, or not iterable)."""
    if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
        return None
    return [_as_item(i) for i in got]


def _share_problems(world_size: int, num_items: int, shares: dict[int, list]) -> list[str]:
    """What is wrong with the ranks' shares taken together: items missing, twice, or unbalanced."""
    label = f"world_size {world_size}, {num_items} items"
    owners: dict[int, list[int]] = {}
    for rank, items in shares.items():
        for item in items:
            owners.setdefault(item, []).append(rank)
    problems = []
    missing = [i for i in range(num_items) if i not in owners]
    if missing:
        left_over = num_items % world_size
        why = (f" (the last num_items % world_size = {left_over}: a share of num_items // world_size items per rank "
               "leaves the remainder out; let rank r start at r * num_items // world_size and stop where rank r + 1 "
               "starts)" if left_over and missing == list(range(num_items - left_over, num_items)) else "")
        problems.append(f"{label}: no rank handles item(s) {missing[:8]}{why}")
    twice = {i: r for i, r in owners.items() if len(r) > 1 and 0 <= i < num_items}
    if twice:
        item, ranks = next(iter(sorted(twice.items())))
        problems.append(f"{label}: item {item} is handled by ranks {ranks} ({len(twice)} item(s) twice); "
                        "each item must belong to exactly one rank")
    outside = sorted(i for i in owners if not (isinstance(i, int) and 0 <= i < num_items))
    if outside:
        problems.append(f"{label}: item(s) {outside[:8]} do not exist (items run from 0 to {num_items - 1})")
    sizes = {rank: len(items) for rank, items in shares.items()}
    if not problems and max(sizes.values()) - min(sizes.values()) > 1:
        low, high = num_items // world_size, -(-num_items // world_size)
        fair = f"{low} each" if low == high else f"{low} or {high}"
        problems.append(f"{label}: shares of {sizes} items per rank; balanced shares differ by at most one "
                        f"item (here {fair})")
    return problems


def check_my_share(fn, world_sizes=SHARE_WORLD_SIZES, num_items=SHARE_NUM_ITEMS) -> CheckReport:
    """Check ``fn(rank, world_size, num_items) -> list of item numbers``: over all ranks the lists
    hold every item of ``range(num_items)`` exactly once, and no rank has more than one item more
    than another (what ``cluster.run(fn, num_items)`` would hand out)."""
    check_callable(fn, "fn(rank, world_size, num_items)")
    report = CheckReport("my share")
    for world_size in world_sizes:
        report.case(f"world_size {world_size} x items {list(num_items)}")
        for n in num_items:
            shares = {}
            for rank in range(world_size):
                label = f"world_size {world_size}, {n} items, rank {rank}"
                items = report.answer(label, fn, (rank, world_size, n), _as_items,
                                      "a list of item numbers such as [0, 1, 2]")
                if items is None:
                    break
                shares[rank] = items
            else:
                report.fail(*_share_problems(world_size, n, shares))
    return raise_or_report(report)


# -- lesson 7: SLURM's variables under torchrun's names --------------------------------------------

def _as_dict(got) -> dict | None:
    return got if isinstance(got, dict) else None


SLURM_CASES = (
    {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODELIST": "node[07-08]",
     "MASTER_PORT": "29500"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODELIST": "laptop"},
    {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[03-06]",
     "MASTER_PORT": "29612"},
    {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODELIST": "login2,cn[10-11],x"},
    {"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURM_LOCALID": "0", "SLURM_NODELIST": "n[1,3-4],login"},
)


def _slurm_hint(name: str, got: str, env: dict) -> str:
    """Why a variable is wrong, where a mix-up of SLURM's variables explains it."""
    if name == "LOCAL_RANK" and got == env["SLURM_PROCID"] != env["SLURM_LOCALID"]:
        return " (that is SLURM_PROCID, the rank in the whole job; the rank on this node is SLURM_LOCALID)"
    if name == "RANK" and got == env["SLURM_LOCALID"] != env["SLURM_PROCID"]:
        return " (that is SLURM_LOCALID, the rank on this node; the rank in the whole job is SLURM_PROCID)"
    return {"MASTER_ADDR": " (the first host of SLURM_NODELIST, with its brackets expanded)",
            "MASTER_PORT": " (SLURM chooses no port: MASTER_PORT if set, else torch's 29500)"}.get(name, "")


def check_slurm_to_torchrun(fn, cases=SLURM_CASES) -> CheckReport:
    """Check ``fn(env) -> dict``: for the variables one ``srun`` task sees, the five torchrun
    variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) as strings, as
    ``read_launch_env(env).as_torchrun_env()`` gives them."""
    check_callable(fn, "fn(env)")
    report = CheckReport("SLURM to torchrun")
    for env in cases:
        label = ", ".join(f"{k}={v}" for k, v in env.items())
        report.case(env["SLURM_NODELIST"])
        want = read_launch_env(env).as_torchrun_env()
        got = report.answer(label, fn, (dict(env),), _as_dict, f"a dict such as {want}")
        if got is None:
            continue
        for name in TORCHRUN_VARS:
            if name not in got:
                report.fail(f"{label}: {name} is missing (expected {name}={want[name]!r})")
            elif str(got[name]) != want[name]:
                report.fail(f"{label}: expected {name}={want[name]!r}, got {got[name]!r}"
                            + _slurm_hint(name, str(got[name]), env))
            elif not isinstance(got[name], str):
                report.fail(f"{label}: {name} is {type(got[name]).__name__} {got[name]!r}; environment variables are "
                            f"strings (os.environ refuses anything else): {name}={want[name]!r}")
    return raise_or_report(report)
