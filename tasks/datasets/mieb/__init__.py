"""MIEB's task families: ``mieb:<task>`` through mteb itself (mieb_tasks.py, source ``mieb``), and clipcache's readers
of MIEB-style folders under any name: visual STS and multiple choice (mieb_layouts.py), composed retrieval
(composed_layouts.py), multilabel (multilabel_layouts.py), ViDoRe (vidore.py). BEIR and any-to-any folders are
tasks/datasets/beir.py and any2any.py."""
