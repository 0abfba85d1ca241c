"""Comparing runs: the paired test of two runs, groups of seeds, where their predictions come from."""
