#!/bin/bash
#SBATCH -J loginvar -p debug -t 2 --gres=gpu:1
echo "login=${GPUPORTAL_ORACLE_LOGIN:-unset}" > login.txt
srun printenv GPUPORTAL_ORACLE_LOGIN > login.step
