#!/bin/bash
#SBATCH --job-name=ddp --partition=debug --time=2
#SBATCH --ntasks-per-node=2 --gres=gpu:a100:2
env | sort > env.batch
srun bash -c 'env | sort > env.step.$SLURM_PROCID'
