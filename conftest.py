"""Repo-level pytest defaults. Benchmark storage and the budgets file are set in
pyproject.toml ([tool.pytest.ini_options]); the plugin itself loads via its entry point."""

# The plugin's own tests drive inner pytest sessions.
pytest_plugins = ["pytester"]
