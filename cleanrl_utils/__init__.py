"""Shared code of the cleanrl scripts, in two layers (tools may import plumbing, never the reverse).

Plumbing, what the scripts in ``cleanrl/`` import:

- ``run``: the life of a run: ``setup`` (command line, ranks, the checkpoint to continue), ``Run``
  (TensorBoard/W&B, Ctrl-C, progress, checkpoint writes, the closing line);
- ``arguments``: the command line, the input rules (one line, exit 2) and the resume rule;
- ``distributed``: ranks, process groups, collectives, the run plan, collective checkpoints;
- ``reshard``: the elastic re-split of a checkpoint saved by N processes for M (pure functions);
- ``checkpoint``: atomic, verified checkpoint files; ``envs``, ``atari_wrappers``: env helpers and
  wrappers; ``buffers``: the replay buffer; ``actors``, ``param_server``: the actor processes and
  parameter server of the actor-learner scripts; ``monitor``, ``nan_guard``: progress, resource
  figures and optimizer steps a NaN never reaches; ``tb``: reading TensorBoard event files.

Tools, what users run (``python -m cleanrl_utils.<tool>``):

- ``benchmark`` (grid runner), ``tuner`` (Optuna; ``tuner_worker``, ``tuner_spaces``, ``trials``),
  ``pbt`` (population-based training on the tuner's storage), ``plot`` (curves and tables; ``scores``), ``enjoy`` (evaluation), ``submit_exp`` (SLURM, AWS Batch);
- ``launch``: what the tools share: starting and stopping a script's processes, locating and
  loading a script, checking a command line against the script's own validation.
"""
