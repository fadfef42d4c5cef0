"""Convert stage: caption images with a multimodal LLM behind an OpenAI-compatible API, write BEIR text-retrieval data."""
