#!/bin/bash
#SBATCH -J gpt -p debug -t 2
#SBATCH --ntasks=2 --gpus-per-task=1
srun bash -c 'echo "rank $SLURM_PROCID of $SLURM_NTASKS home=$HOME" > rank.$SLURM_PROCID; env | sort > env.step.$SLURM_PROCID'
