"""What is trained and how: training specs and the built-in workloads, recipes and their knob table, whether a case
can run here, the suite's cases and ladders, the training setup that applies a recipe, the correctness guards."""
