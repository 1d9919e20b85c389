#!/bin/bash
#SBATCH -J strict -p debug -t 2 --ntasks=2 --gres=gpu:1
set -euo pipefail
srun bash -c 'echo "$SLURM_PROCID $HOME"' | sort > ranks.txt
python3 -c 'import sys; print(sys.version_info[0])' > python.txt
env | sort > env.batch
