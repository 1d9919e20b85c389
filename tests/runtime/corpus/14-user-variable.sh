#!/bin/bash
#SBATCH -J uservar -p debug -t 2 --gres=gpu:1
# DATASET is given at submission (the portal's environment, exported before sbatch)
echo "dataset=$DATASET" > dataset.txt
srun bash -c 'echo "step dataset=$DATASET"' > dataset.step
