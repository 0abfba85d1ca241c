"""The evaluate phase: predictions, scores, plots and temperature scaling."""
