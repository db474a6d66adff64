"""The task code beside these YAMLs is :mod:`.utils`."""
