"""robotrl.rl: actor-critic RL on a task's vector env: SAC / RLPD / WSRL (`sac`) and its actor/learner split
(`actor_learner`), PPO on the CPU backend (`ppo`) and on MJX (`ppo_mjx`), offline IQL and Cal-QL over a store
(`offline`, `iql`, `calql`), the store-backed replay (`replay`), and Stable-Baselines3 on robotrl tasks (`sb3`).
Each algorithm reads top to bottom in its own module."""
