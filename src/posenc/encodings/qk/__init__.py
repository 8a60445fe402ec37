"""Encodings of the queries and keys: RoPE, xPos, RoPE on grids (axial, M-RoPE) and PoPE."""
