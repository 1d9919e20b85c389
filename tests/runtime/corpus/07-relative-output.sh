#!/bin/bash
#SBATCH -J relout -p debug -t 2 --gres=gpu:1
#SBATCH --output=%x-%j.out
echo "stdout of $SLURM_JOB_NAME"
echo "stderr too" >&2
