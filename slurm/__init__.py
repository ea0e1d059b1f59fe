"""Running crawls on a Slurm cluster: the Python beside the scripts of this folder.

``slurm/submit`` submits a job array whose tasks run ``python -m slurm.task``
(``crawl.sbatch``) and a job that runs ``python -m slurm.ship merge`` after them
(``merge.sbatch``). ``task`` is the command line, ``runner`` a task's crawl processes
in shard mode, ``queue`` in queue mode, ``ship`` shipping to shared storage.
"""
