"""Single-file deep RL algorithms; each script is self-contained."""
