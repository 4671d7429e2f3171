"""Each process group's members as the ranks see them, and the groups whose members they disagree on."""

from __future__ import annotations

DEFAULT = "0"  # torch's name for the default (world) group


def memberships(records: dict[int, dict], world_size: int) -> dict[str, tuple[str, list[int]]]:
    groups: dict[str, tuple[str, list[int]]] = {}
    for _, record in sorted(records.items(), reverse=True):  # where views differ, the lowest rank's stands in
        for name, info in record.get("groups", {}).items():
            groups[name] = (info.get("desc", ""), list(info.get("ranks", [])))
    # a group no record lists the members of: the default group ("0") is the world; any other is taken to
    # hold only the ranks seen calling in it (never the whole world: that would call the others "not reached")
    listed, callers, descs = set(groups), {}, {}
    for rank, record in records.items():
        for call in record.get("calls", []):
            if call["group"] not in listed:
                callers.setdefault(call["group"], set()).add(rank)
                descs.setdefault(call["group"], call.get("desc", ""))
    for name, ranks in callers.items():
        groups[name] = (descs[name], list(range(world_size)) if name == DEFAULT else sorted(ranks))
    return groups


def views(records: dict[int, dict]) -> dict[str, dict]:
    """Groups whose members the ranks disagree on: name -> {"seen": members -> the ranks that see
    them so} (torch names groups by a counter: ranks that create them in different orders give one
    name to different groups); diagnose adds "shown": the rank whose view the findings use."""
    views: dict[str, dict[tuple[int, ...], list[int]]] = {}
    for rank, record in sorted(records.items()):
        made = [(name, info.get("ranks", [])) for name, info in record.get("groups", {}).items()]
        creating = record.get("creating")
        for name, ranks in made + ([(creating["name"], creating["ranks"])] if creating else []):
            views.setdefault(name, {}).setdefault(tuple(ranks), []).append(rank)
    return {name: {"seen": seen} for name, seen in views.items() if len(seen) > 1}
