#!/bin/bash
#SBATCH -J torchrun -p debug -t 2
#SBATCH --nodes=1 --ntasks=1 --gpus-per-task=2 --cpus-per-task=2
# torchrun starts its workers from one srun task
srun python3 -c 'import os; open("env.step.%s" % os.environ["SLURM_PROCID"], "w").write("".join(sorted("%s=%s\n" % kv for kv in os.environ.items())))'
echo "launched from $(pwd)"
