"""Sampling: batched generation on transformers, the in-process engine, the HTTP generator."""
