"""lm-eval tasks of the WMDP benchmark (the YAMLs here, their data code in ``utils.py``; the real
questions' task in ``wmdp_local/``, read by :func:`unlearn_plugins.benchmarks.wmdp.data.wmdp_dataset`)."""
