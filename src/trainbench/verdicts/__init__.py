"""What measurements conclude: saved runs, comparisons, the gate, A/B, explanations, reports, the machine's fitness and a GPU's plan."""
