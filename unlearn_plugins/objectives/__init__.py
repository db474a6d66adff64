"""Unlearning objectives (training losses) and the ROL regulariser; registered by
:mod:`unlearn_plugins.objectives.builtin`."""
