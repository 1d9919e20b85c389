#!/bin/bash
#SBATCH -J relin -p debug -t 2 --gres=gpu:1
read -r value < data/input.txt
echo "input was $value" > result.txt
srun bash -c 'cat data/input.txt > step-input.$SLURM_PROCID'
