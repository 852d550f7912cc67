"""From one GPU box to a cluster: shards placed by a scheduler, and their progress.

:mod:`.environment` (which shard this process is: SLURM array or step tasks, torchrun, our Ray
runner), :mod:`.slurm` (an sbatch array of shards that requeue when preempted, and a merge job
after it), :mod:`.ray_runner` (the shards as Ray tasks, then the merge), :mod:`.status` (the
shards' counts, rates and ETAs read from the shared journal) and :mod:`.cli`. Nothing here needs
SLURM or Ray installed until a command uses them (Ray: ``pip install 'eagle3_raw[ray]'``).
"""
