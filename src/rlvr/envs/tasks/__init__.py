"""Procedural tasks: row generators with their reward functions, no download needed."""
