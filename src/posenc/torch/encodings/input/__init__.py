"""Encodings added to the token embeddings ``(batch, seq, dim)``: sinusoidal, learned, MAE's 2-D."""
