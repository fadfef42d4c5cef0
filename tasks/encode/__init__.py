"""Encode stage: models and datasets in, L2-normalised embeddings out, written to the embedding cache."""
