"""Weight sync: the lanes that make a sampler serve the policy version just trained."""
