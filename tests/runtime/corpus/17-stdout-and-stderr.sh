#!/bin/bash
#SBATCH -J streams -p debug -t 2 --gres=gpu:1
echo "to stdout"
echo "to stderr" >&2
