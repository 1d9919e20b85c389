#!/bin/bash
#SBATCH -J chdirrel -p debug -t 2 --gres=gpu:1
#SBATCH --chdir=sub
pwd > pwd.txt
echo "SUBMIT=$SLURM_SUBMIT_DIR" > submit.txt
