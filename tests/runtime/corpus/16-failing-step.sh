#!/bin/bash
#SBATCH -J failstep -p debug -t 2 --gres=gpu:1
set -e
srun bash -c 'exit 7'
echo "never here"
