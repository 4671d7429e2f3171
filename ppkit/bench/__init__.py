"""Benchmarks: ``comm`` measures collectives and point-to-point transfers like nccl-tests."""
