"""Encodings of the queries and keys: RoPE (its tables and pairings), xPos, grid RoPE, PoPE."""
