"""Failing a rank on purpose, while it trains (docs/faults.md): ``ppkit.fail_rank`` in the kernel
(arming.py), ``ppkit.step(i)`` in the rank's loop (on_rank.py), what a fault is (plan.py)."""
