#!/bin/bash
#SBATCH -J multinode -p debug -t 2
#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1
srun bash -c 'env | sort > env.step.$SLURM_PROCID'
srun -l hostname | sort | sed 's/ .*//' > ranks.txt
