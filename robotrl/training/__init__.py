"""robotrl.training: what every learner shares, above the envs, policies and datasets it reads and below every
algorithm: the training loop's pieces (`loop`: run directory, logging, EMA, exact resume, checkpoints kept) and
evaluation of any trained policy on held-out seeds (`evaluate`, also `robotrl policy eval`)."""
