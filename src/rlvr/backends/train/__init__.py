"""Training: the torch trainer, the SFT warm start and the losses."""
