"""Each process group's members as the ranks see them, and the groups whose members they disagree on."""

from __future__ import annotations


def memberships(records: dict[int, dict], world_size: int) -> dict[str, tuple[str, list[int]]]:
    groups: dict[str, tuple[str, list[int]]] = {}
    for _, record in sorted(records.items(), reverse=True):  # where views differ, the lowest rank's stands in
        for name, info in record.get("groups", {}).items():
            groups[name] = (info.get("desc", ""), list(info.get("ranks", [])))
    for record in records.values():
        for call in record.get("calls", []):
            if call["group"] not in groups:
                groups[call["group"]] = (call.get("desc", ""), list(range(world_size)))
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
