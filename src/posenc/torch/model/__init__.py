"""Models built from the layers below: multi-head attention and a small language model.

May import everything below it (encodings, attention core, caches); nothing imports it.
"""
