"""lm-eval tasks of the WMDP benchmark (the YAMLs here, their data code in ``utils.py``)."""
