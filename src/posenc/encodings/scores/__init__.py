"""Biases added to the attention scores: ALiBi and T5 buckets (fixed shape), KERPLE and FIRE."""
