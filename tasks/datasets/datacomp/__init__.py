"""DataComp's evaluation sets beyond clip_benchmark's: WILDS and fairness sets with per-sample metadata
(``wilds/*``, ``fairness/*``: group_layouts.py, group_originals.py, face_attributes.py; source ``group_layouts``)
and WinoGAViL (``misc/winogavil``: winogavil.py; source ``winogavil``)."""
