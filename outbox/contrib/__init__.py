"""Optional integrations with other packages: ``anymail`` (ESP events)."""
