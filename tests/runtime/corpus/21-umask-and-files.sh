#!/bin/bash
#SBATCH -J umask -p debug -t 2 --gres=gpu:1
mkdir -p results/run1
echo done > results/run1/metrics.txt
stat -c '%a %U' results results/run1/metrics.txt > modes.txt
