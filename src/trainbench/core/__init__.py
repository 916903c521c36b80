"""The measurement core, free of pytest: specs, recipes, training, the method, results and their budgets."""
