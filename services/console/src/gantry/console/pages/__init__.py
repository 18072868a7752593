"""The console's sections, one module each, each with a ``router``."""
