"""Example clipcache plugins (see docs/plugins.md in the clipcache repository).

- ``glossary_clip`` (group ``clipcache.models``): any open_clip model, reading texts through a word glossary first
  (shipped: Japanese -> English shape and colour words), so an English model can be evaluated on Japanese prompts.
- ``csv_captions`` (group ``clipcache.datasets``): image-text retrieval data as ``<root>/<split>.csv`` with the columns
  ``image,caption``, one row per caption.
- ``shapes_of_colour`` (group ``clipcache.dataset_sources``): a whole dataset source, the names ``shapes_of/<colour>``
  (the bundled shapes of one colour, classified by shape).

Nothing here is imported by ``import clipcache``: clipcache reads the entry points' names and imports a module only
when its name is used.
"""
