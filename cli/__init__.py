"""The ``tuner`` command: parsing, one module per command group, and rendering."""
