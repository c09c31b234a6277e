"""The recording proxy: an OpenAI-compatible (and Anthropic Messages) endpoint in front of a run's
generator, through which an unmodified agent's model calls are sampled, recorded per episode and
stitched into training segments (:mod:`rlvr.rollouts.turns`)."""
