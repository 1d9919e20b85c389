#!/bin/bash
#SBATCH -J chdirflag -p debug -t 2 --gres=gpu:1
# submitted with --chdir=sub2 on the command line (the form's and API's workdir field)
pwd > pwd.txt
env | sort > env.batch
