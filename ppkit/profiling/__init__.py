"""Profiling ranked code: every rank under torch.profiler, one merged timeline (docs/profiling.md).

collect.py runs on the ranks; clocks.py measures each rank's clock against the kernel's; merge.py puts
the ranks' traces on that one clock; summary.py and timeline.py read the merged events; profile.py is
the ``ppkit.Profile`` a profiled run returns."""
