"""SLURM, used as it is: sbatch, srun, squeue, scancel and scontrol from PATH (SLURM_CONF honoured).

options.py checks what a learner passes; commands.py runs SLURM's tools and words their errors;
script.py writes what gets submitted (and ``ppkit slurm-script``'s script); hosts.py finds the
addresses (MASTER_ADDR, where the notebook listens); watch.py follows a job and shows it while it
is pending; reaper.py cancels a job whose notebook died. The launcher is launchers/slurm.py.
"""
