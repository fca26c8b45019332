"""robotrl.stages: the stages of the pipeline that are not RL: behaviour cloning (`bc`), distillation to a
one-step student (`distill`), and `robotrl run`, which chains demos -> BC -> offline -> online -> distillation
-> export with a recipe per task (`pipeline`)."""
