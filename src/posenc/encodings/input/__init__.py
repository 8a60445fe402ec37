"""Encodings added to the token embeddings: the sinusoidal table and MAE's 2-D table."""
