"""LAION clip_benchmark's datasets: its builder's original layouts (layouts.json, read by layout_readers.READERS), its
webdataset layout and hosted catalog (catalog.csv, download.py), its collections and its prompts in several
languages. The sources that read them are ``original``, ``webdataset`` and ``hosted`` (tasks/datasets/sources.py)."""
