"""``gpuportal``: the command-line client of the portal's REST API (stdlib only: it runs on login
nodes and laptops without Django). ``main`` is the entry point; ``sbatch`` reads ``#SBATCH`` lines
and Slurm time strings; ``client`` speaks HTTP; ``config`` keeps the URL and token."""
