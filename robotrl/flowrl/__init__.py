"""robotrl.flowrl: RL of flow policies around one shared chain module (`chain`: the K-step denoising chain, its
methods, the observation windows and the semi-MDP rollout): online PPO (`online`), RL-100's offline stage
(`offline`), human-in-the-loop PPO (`hil`), DSRL-SAC in the noise space (`dsrl`), and the success classifier that
rewards a task without one (`classifier`)."""
