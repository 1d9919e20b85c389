"""Demo data for jobs: site-wide job templates. Idempotent (called by ``manage.py seed_demo``)."""

from __future__ import annotations

from jobs.choices import TemplateScope
from jobs.models import JobTemplate

SITE_TEMPLATES = [
    {
        "name": "PyTorch DDP, 1 node, 4 GPUs",
        "description": "torchrun with one process per GPU on one node.",
        "gpus": 4,
        "nodes": 1,
        "cpus_per_gpu": 4,
        "time_limit_minutes": 240,
        "script": (
            "#!/bin/bash\n"
            "set -euo pipefail\n"
            "echo \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $(hostname)\"\n"
            "torchrun --standalone --nproc_per_node=4 train.py\n"
        ),
    },
    {
        "name": "PyTorch DDP, 2 nodes, 8 GPUs",
        "description": "torchrun across two nodes, 4 GPUs each (rendezvous on the first node).",
        "gpus": 8,
        "nodes": 2,
        "cpus_per_gpu": 4,
        "time_limit_minutes": 480,
        "script": (
            "#!/bin/bash\n"
            "set -euo pipefail\n"
            "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n"
            "srun torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=\"$head:29500\" train.py\n"
        ),
    },
    {
        "name": "Single GPU smoke test",
        "description": "Prints the GPU the job got; finishes at once.",
        "gpus": 1,
        "nodes": 1,
        "cpus_per_gpu": 1,
        "time_limit_minutes": 5,
        "script": "#!/bin/bash\necho \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $(hostname)\"\nnvidia-smi || true\n",
    },
    {
        "name": "Jupyter on one GPU (debug partition)",
        "description": "A notebook server on the debug partition for up to an hour.",
        "partition": "debug",
        "gpus": 1,
        "nodes": 1,
        "cpus_per_gpu": 2,
        "time_limit_minutes": 60,
        "script": "#!/bin/bash\njupyter lab --no-browser --ip=0.0.0.0 --port=${PORT:-8888}\n",
    },
]


def seed(*, stdout=None) -> int:
    """Create the site templates that are missing (by name); existing ones are left as they are.
    Returns how many were created."""
    created = 0
    for spec in SITE_TEMPLATES:
        _, was_created = JobTemplate.objects.get_or_create(scope=TemplateScope.SITE, name=spec["name"], defaults=spec)
        created += was_created
    if stdout is not None:
        stdout.write(f"jobs: {created} site job template(s) created, {len(SITE_TEMPLATES) - created} already there.")
    return created
