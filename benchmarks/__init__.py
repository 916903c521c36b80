"""The trainbench suite: pytest cases (test_recipes.py) and the asv benchmarks built from them (asv_bench.py)."""
