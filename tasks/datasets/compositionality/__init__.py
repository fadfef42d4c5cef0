"""Compositionality benchmarks read through registered readers (tasks/datasets/loaders.py): ARO, VALSE and MMVP-VLM
(compositionality.py), COLA, CREPE and VL-CheckList (compositionality_more.py), SVO-Probes (svo_probes.py). SugarCrepe
and Winoground, clip_benchmark's own, are read by tasks/datasets/selection.py."""
