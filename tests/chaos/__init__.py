"""The chaos run: see ``tests/chaos/run.py`` and ``tests/chaos/run.sh``."""
