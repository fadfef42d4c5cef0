"""Model loaders. ``resolve_model`` turns a :class:`ModelSpec` into a load-free identity (for cache keys);
``load_model`` builds the torch model only when something actually needs encoding."""
