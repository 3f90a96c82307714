"""The chaos run (issue 5): see ``chaos/run.py`` and ``scripts/chaos.sh``."""
