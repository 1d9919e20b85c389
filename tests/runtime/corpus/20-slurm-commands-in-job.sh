#!/bin/bash
#SBATCH -J tools -p debug -t 2 --gres=gpu:1
srun --version > srun-version.txt
scontrol show job "$SLURM_JOB_ID" | grep -o 'JobState=[A-Z]*' > state.txt
command -v srun > which-srun.txt
