#!/usr/bin/env bash
# Entrypoint of the cluster image: turns the AWS Batch job's variables into the run's flags.
#
#   multi-node parallel job (AWS_BATCH_JOB_NUM_NODES > 1): one torchrun per node, all meeting at the
#     main node (c10d rendezvous; the main node has no MAIN_NODE address variable and uses its own);
#     the arguments are the script and its flags;
#   array job of a grid (CLEANRL_GRID="env|seed|run ..."): task AWS_BATCH_JOB_ARRAY_INDEX adds its
#     --env-id, --seed and --run-name; the arguments are the command ("python cleanrl/ppo.py --track");
#   anything else runs as given.
#
# Run directories are keyed by the job (runs/<job-name>-<job-id>/...): a retried attempt has the same
# job id, finds its checkpoint on the shared runs/ volume and continues with --resume. CLEANRL_RUN
# (submit_exp.py --resume-run) names an earlier multi-node job's run to continue instead, on this
# job's node count (the scripts re-split a run saved on another number of processes).
set -euo pipefail
cd "${CLEANRL_WORKDIR:-/workspace}"
job_name="${CLEANRL_JOB_NAME:-cleanrl}"

resume=()
resume_if_checkpoint() {
    if compgen -G "runs/$1/checkpoints/ckpt_*.pt" >/dev/null; then resume=(--resume "runs/$1"); fi
}

if [ -n "${AWS_BATCH_JOB_NUM_NODES:-}" ]; then  # (set for multi-node parallel jobs only, of any size)
    job_id="${AWS_BATCH_JOB_ID%%#*}"
    main="${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-$(hostname -i | awk '{print $1}')}"
    run="${CLEANRL_RUN:-$job_name-$job_id/run}"
    resume_if_checkpoint "$run"
    echo "node ${AWS_BATCH_JOB_NODE_INDEX:-0} of $AWS_BATCH_JOB_NUM_NODES, rendezvous $main:${CLEANRL_RDZV_PORT:-29400}, run $run"
    exec python -m torch.distributed.run --nnodes="$AWS_BATCH_JOB_NUM_NODES" \
        --nproc-per-node="${CLEANRL_NPROC_PER_NODE:-1}" --rdzv-backend=c10d \
        --rdzv-endpoint="$main:${CLEANRL_RDZV_PORT:-29400}" --rdzv-id="$job_id" \
        "$@" --run-name "$run" --no-progress "${resume[@]}"
elif [ -n "${CLEANRL_GRID:-}" ]; then
    read -ra tasks <<<"$CLEANRL_GRID"
    index="${AWS_BATCH_JOB_ARRAY_INDEX:-0}"
    IFS='|' read -r env_id seed run <<<"${tasks[$index]}"
    job_id="${AWS_BATCH_JOB_ID:-local}"
    run="$job_name-${job_id%%:*}/${run#*/}"
    resume_if_checkpoint "$run"
    echo "task $index of ${#tasks[@]}: $env_id seed $seed, run $run"
    exec "$@" --env-id "$env_id" --seed "$seed" --run-name "$run" --no-progress "${resume[@]}"
else
    exec "$@"
fi
