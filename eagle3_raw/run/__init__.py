"""A build, stage by stage: the target and the checks before any generation, the plan (which rows,
rendered how, with which seed), the feed to the workers, dispatch over the endpoint pool, rollouts
of later turns, and the orchestration of them all (:mod:`~eagle3_raw.run.build`)."""
