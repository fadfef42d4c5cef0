"""Score stage: pure functions from cached embeddings (numpy arrays and ids) to metrics. No model code here."""
