"""What measurements conclude: saved runs, comparisons, the gate, explanations, presentation, calibration, reports and\nthe bisect search."""
