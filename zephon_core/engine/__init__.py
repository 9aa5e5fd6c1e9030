"""Running a recipe: execution settings, the compiled plan, lanes, runners, shared memory,
the per-rank loader, checkpoints and simulated ranks."""
