# The image for cluster jobs (AWS Batch, or any container runtime): CUDA PyTorch and this project.
#   docker build --build-arg GIT_REVISION=$(git rev-parse HEAD) -t cleanrl:$(git rev-parse --short HEAD) .
# Jobs start in /workspace through docker/entrypoint.sh, which maps AWS Batch's array and
# multi-node variables to the run's flags; mount shared storage on /workspace/runs.
# torch 2.6 at least: the floor pyproject.toml states (tests/test_submit.py checks the two agree)
FROM pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime

ARG GIT_REVISION=unknown
LABEL org.opencontainers.image.source="cleanrl" \
      org.opencontainers.image.revision="${GIT_REVISION}"

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    CLEANRL_WORKDIR=/workspace
WORKDIR /workspace

# The dependencies first (a layer that changes only with pyproject.toml); torch comes with the base image.
COPY pyproject.toml README.md ./
COPY cleanrl/ cleanrl/
COPY cleanrl_utils/ cleanrl_utils/
RUN pip install -e ".[atari,envpool,mujoco,optuna,plot,cloud]"

COPY docker/entrypoint.sh docker/entrypoint.sh
ENTRYPOINT ["/workspace/docker/entrypoint.sh"]
CMD ["python", "cleanrl/ppo.py", "--help"]
