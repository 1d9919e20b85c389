#!/bin/bash
#SBATCH -J exit3 -p debug -t 2 --gres=gpu:1
echo "about to fail"
exit 3
