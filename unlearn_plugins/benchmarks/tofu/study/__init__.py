"""TOFU's study kind: a study of TOFU's authors (``[benchmark] source`` ``tofu``, ``generated`` or
``auto``, the default), by forget size (:mod:`.cells`, :mod:`.report`) or with authors as the unit
(:mod:`.design`, :mod:`.design_plan`, :mod:`.author_report`, the sweep's traces :mod:`.trace` and
operating points :mod:`.operating_point`, :mod:`.operating_cell`); :mod:`..runner` is what the
core's `unlearn study` reaches."""
