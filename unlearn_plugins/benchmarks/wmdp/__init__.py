"""WMDP (Li et al. 2024): its real corpora and questions when the user has them (:mod:`.data`), a
small synthetic "hazardous topic" stand-in generated in code (:mod:`.synthetic`), its lm-eval tasks
(``tasks/``) and the ``wmdp_synthetic`` study (:mod:`.runner`), reached through :mod:`.plugin`."""
