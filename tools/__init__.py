"""Developer tools, run from a source checkout (`python -m tools.<name>`); not shipped with the app."""
