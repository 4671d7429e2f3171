"""Tools around a cluster, not part of running one: ``ppkit doctor``, reading a launcher's environment
(torchrun, SLURM), the one all-reduce check across machines, torchrun with its store on one address,
and two network namespaces as two machines (notebook 07 and the tests)."""
