"""`mtp ablate --launcher slurm`: the grid's stages as Slurm jobs, submitted with submitit.

`submit` turns each stage a run still lacks into a job (training through torchrun, export+eval and
specbench after it with `afterok`) and records the job ids in the run folder; `jobs` holds what runs
inside a job; `worker` is the torchrun entry point; `status` reads the folder and the queue back.
"""
