"""LoRA adapter initializers; built-ins registered by :mod:`unlearn_plugins.initializers.builtin`."""
