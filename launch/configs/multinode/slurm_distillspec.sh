#!/usr/bin/env bash
# DistillSpec on several Slurm nodes: one `accelerate launch` per node, one process per GPU.
#
#   sbatch launch/configs/multinode/slurm_distillspec.sh                      # defaults below
#   sbatch --nodes 4 launch/configs/multinode/slurm_distillspec.sh max_steps=20000 divergence=tvd
#   ACCEL_CONFIG=launch/configs/accelerate/deepspeed_zero3.yaml sbatch launch/configs/multinode/slurm_distillspec.sh
#
# Run it from the repository root on a filesystem every node sees. The job resumes from the last complete
# checkpoint in OUTPUT_DIR when it is requeued (--resume_from_checkpoint auto), so `scontrol requeue` and
# preemption lose at most save_steps steps. Extra arguments go to the recipe (key=value or --key value).
#SBATCH --job-name=distillspec
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out

set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
ACCEL_CONFIG=${ACCEL_CONFIG:-launch/configs/accelerate/deepspeed_zero2.yaml}
RECIPE_CONFIG=${RECIPE_CONFIG:-launch/configs/recipes/distillspec_small.yaml}
OUTPUT_DIR=${OUTPUT_DIR:-runs/distillspec-${SLURM_JOB_ID}}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
NUM_PROCESSES=$((SLURM_NNODES * GPUS_PER_NODE))

echo "nodes=$SLURM_NNODES processes=$NUM_PROCESSES master=$MASTER_ADDR:$MASTER_PORT output=$OUTPUT_DIR"

# SLURM_NODEID is expanded on each node by the inner shell (hence the escaped \$).
srun --kill-on-bad-exit=1 bash -c "accelerate launch \
    --config_file $ACCEL_CONFIG \
    --num_machines $SLURM_NNODES \
    --num_processes $NUM_PROCESSES \
    --machine_rank \$SLURM_NODEID \
    --main_process_ip $MASTER_ADDR \
    --main_process_port $MASTER_PORT \
    --rdzv_backend c10d \
    recipes/distillspec.py \
    --config $RECIPE_CONFIG \
    --output_dir $OUTPUT_DIR \
    --resume_from_checkpoint auto \
    use_cpu=false $*"
