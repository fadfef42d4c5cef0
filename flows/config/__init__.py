"""Parameters and config adapters: the flows' parameter models (params, convert_params), the typed settings a run
reads (run_settings), and the evalscope / MTEB task configs read into them. Imports nothing else from flows/."""
