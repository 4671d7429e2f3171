"""What each notebook needs in memory, as measured by benchmarks/bench_memory.py (docs/memory.md says how).

``MEASURED`` is the benchmark's table as data: ``ppkit preflight`` compares each row's need with the learner's
limit, and tests/test_memory.py checks that docs/memory.md shows exactly :func:`markdown_table` of it. After
a change that moves memory, run the benchmark and paste its rows here (and its table in docs/memory.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2**20
HEADROOM = 1.25  # over the measured peak: another torch version, a learner's bigger batch, sampling between peaks
ROUND_MIB = 256  # limits are set in round numbers


@dataclass(frozen=True)
class NotebookMemory:
    """One notebook's peaks in MiB over its whole run, kernel and every process it started together."""
    notebook: str
    rss_sum_mib: int  # resident memory summed (shared pages counted once per process: an upper bound)
    pss_sum_mib: int  # proportional set size summed (shared pages split)
    largest_process_mib: int
    processes: int  # when the RSS sum peaked
    cgroup_peak_mib: int | None  # what the kernel's own memory cgroup was charged at most (None: not measured)
    shm_peak_mib: int  # /dev/shm
    seconds: float  # run time on the measuring machine (noisy: shared)

    @property
    def need_mib(self) -> int:
        """The memory limit to give a learner for this notebook: the larger of the PSS sum and the cgroup's
        peak, with ``HEADROOM``, rounded up to ``ROUND_MIB``."""
        peak = max(self.pss_sum_mib, self.cgroup_peak_mib or 0)
        return math.ceil(peak * HEADROOM / ROUND_MIB) * ROUND_MIB

    @property
    def shm_need_mib(self) -> int:
        """The /dev/shm it needs: its peak with ``HEADROOM``, rounded up to 16 MiB (0 if it used none)."""
        return math.ceil(self.shm_peak_mib * HEADROOM / 16) * 16


HEADER = ("| notebook | peak RSS sum (MiB) | peak PSS sum (MiB) | largest process (MiB) | processes | cgroup peak "
          "(MiB) | /dev/shm peak (MiB) | run time (s) | memory to give (MiB) | /dev/shm to give (MiB) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def markdown_row(n: NotebookMemory) -> str:
    cgroup = "-" if n.cgroup_peak_mib is None else n.cgroup_peak_mib
    return (f"| {n.notebook} | {n.rss_sum_mib} | {n.pss_sum_mib} | {n.largest_process_mib} | {n.processes} | "
            f"{cgroup} | {n.shm_peak_mib} | {n.seconds:.0f} | {n.need_mib} | {n.shm_need_mib} |")


def markdown_table(rows: tuple[NotebookMemory, ...] | list[NotebookMemory] | None = None) -> str:
    return "\n".join([HEADER, *(markdown_row(n) for n in (MEASURED if rows is None else rows))])


MACHINE = ("2-core AMD EPYC VM shared with other sessions (load average 14 to 44), 23.5 GiB memory, Linux 6.18, "
           "cgroup v1 memory controller; Python 3.11.7, torch 2.14.1, torchvision 0.29.1; 2026-11-25")
# notebook, RSS sum, PSS sum, largest process, processes, cgroup peak, /dev/shm peak (MiB), seconds
MEASURED: tuple[NotebookMemory, ...] = (
    NotebookMemory("00_start_here.ipynb", 3014, 1628, 873, 5, 1576, 0, 118.0),
    NotebookMemory("01_point_to_point.ipynb", 1837, 729, 722, 4, 718, 0, 55.7),
    NotebookMemory("02_collectives.ipynb", 2552, 827, 744, 6, 811, 0, 74.9),
    NotebookMemory("03_data_parallel.ipynb", 6849, 2502, 731, 15, 2454, 0, 215.5),
    NotebookMemory("04_rpc_rref.ipynb", 2521, 1288, 756, 4, 1275, 0, 111.8),
    NotebookMemory("05_model_parallel.ipynb", 3041, 1826, 1221, 4, 1773, 0, 227.5),
    NotebookMemory("06_pipeline.ipynb", 5751, 4514, 3386, 4, 4544, 0, 441.6),
    NotebookMemory("07_two_machines.ipynb", 2733, 1635, 975, 4, 1706, 0, 252.5),
    NotebookMemory("08_modern_pipelining.ipynb", 6530, 4462, 2264, 7, 4421, 0, 422.8),
    NotebookMemory("08b_step_memory.ipynb", 2636, 1455, 1079, 4, 1267, 0, 19.5),  # --timeout 60, isolation
    NotebookMemory("08c_step_speed.ipynb", 1574, 995, 887, 5, 936, 0, 33.3),  # 2026-11-27, warm Inductor cache
    NotebookMemory("09_sharded_data_parallel.ipynb", 3207, 1324, 733, 6, 1302, 0, 126.1),
    NotebookMemory("10_tensor_parallel.ipynb", 3385, 1465, 809, 6, 1315, 0, 16.1),  # with SP (docs/memory.md)
    NotebookMemory("10b_overlap.ipynb", 4092, 2003, 1046, 8, 1745, 0, 43.3),  # 2026-11-27, same machine
    NotebookMemory("11_context_parallel.ipynb", 3671, 1822, 748, 6, 1764, 0, 187.3),
    NotebookMemory("12_expert_parallel.ipynb", 3293, 1454, 743, 6, 1399, 0, 55.4),  # --timeout 60 (docs/memory.md)
    NotebookMemory("13_composition.ipynb", 5523, 2144, 806, 10, 1996, 0, 30.0),  # with activations, --timeout 60
    NotebookMemory("14_capstone.ipynb", 6233, 2706, 786, 13, 2577, 0, 109.0),  # 2026-11-29, load average ~15
)
