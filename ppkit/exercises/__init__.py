"""The exercises: what the learner writes in a notebook, checked on real ranks.

    workbook     the learner's side: check(name, fn), hint(name), solution(name), progress()
    catalog      every exercise in one place: its checker, solution and hints
    solutions    one solution per exercise, out of the learner's notebook
    report       what every checker returns (CheckReport) or raises (ExerciseFailed)
    subworld     runs a learner's function on ranks 0..k-1 of a cluster, in a fresh process group
    check_basics     notebooks 01-03 (ring shift, ring all-reduce, bucketed average)
    check_debugging  notebook 02's collective bug (the mean loss over uneven ranks, with DETAIL)
    check_launch     notebooks 00 and 07 (each rank's share, SLURM's variables)
    check_pipeline   notebooks 05, 06 and 08 (shapes, step time, activations held)
    check_sharding   notebooks 09 and 10
    check_attention  notebook 11 (the log-sum-exp merge)
    check_moe        notebook 12 (the dispatch's split sizes)
    check_composition  notebook 13 (a mesh for a memory budget, measured)
"""
