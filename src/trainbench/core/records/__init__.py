"""What a case produced and the rules read from it, torch-free: the metric registry, the statistics of rounds,
results and their one serialized form, budgets and their checks, a case's outcome."""
