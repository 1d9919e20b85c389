#!/bin/bash
#SBATCH -J sweep -p debug -t 2 --gres=gpu:1
#SBATCH --array=0-2 --output=sweep-%A_%a.log
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in $(pwd)"
env | sort > env.batch.$SLURM_ARRAY_TASK_ID
