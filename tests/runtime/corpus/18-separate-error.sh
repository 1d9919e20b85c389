#!/bin/bash
#SBATCH -J seperr -p debug -t 2 --gres=gpu:1
#SBATCH -o %x.%j.out -e %x.%j.err
echo "out line"
echo "err line" >&2
