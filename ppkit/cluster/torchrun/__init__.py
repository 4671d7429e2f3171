"""``%%torchrun``, ``%torchrun`` and ``ppkit.torchrun``: a torchrun script (or a cell's function) in
fresh processes forked from ppkit.spawn's fork server, each with the environment torchrun gives its
workers. ``options`` reads torchrun's command line (``output_options``: its output options, applied
by cluster/output/), ``environ`` builds the workers' variables,
``rank`` is what each process runs, ``launch`` starts them and ``magic`` is the IPython front."""
