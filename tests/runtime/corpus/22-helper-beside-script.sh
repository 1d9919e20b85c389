#!/bin/bash
#SBATCH -J helper -p debug -t 2 --gres=gpu:1
bash ./helper.sh > helper.out
srun bash ./helper.sh > helper.step
