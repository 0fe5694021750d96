"""The rollouts wing, above `policy`: the lockstep engine (engine), where it runs (executors: local
processes or Ray), the per-episode outcome cache (episode_cache), the scenario families and scenes a
rollout gauntlet draws from (scenarios) and the closed-loop evaluation's views (evaluation)."""
