"""The measurement core, free of pytest, in wings (lowest first; a wing imports itself and those before it):
harness, records, setups, analyses, method, processes. ``tests/test_architecture.py`` holds the rule."""
