#!/usr/bin/env python3
#SBATCH -J pyjob -p debug -t 2 --gres=gpu:1
import os

with open("py-env.txt", "w") as out:
    for name in sorted(os.environ):
        out.write(f"{name}={os.environ[name]}\n")
print("dataset", os.environ.get("DATASET", "unset"))
