"""The chaos run (issue 5): see ``tests/chaos/run.py`` and ``tests/chaos/run.sh``."""
