#!/bin/bash
#SBATCH -J arr -p debug -t 2 --gres=gpu:1 --array=1-2
echo "array task $SLURM_ARRAY_TASK_ID"
srun bash -c 'env | sort > env.step.$SLURM_ARRAY_TASK_ID'
