#!/bin/bash
#SBATCH -J cdsubmit -p debug -t 2 --gres=gpu:1
cd "$SLURM_SUBMIT_DIR"
pwd > where.txt
echo "submit dir $SLURM_SUBMIT_DIR"
