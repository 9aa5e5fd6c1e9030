"""Operators: the transform/accumulator/combiner contract; built-in shuffle, pack and text ops."""
