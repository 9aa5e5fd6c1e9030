"""Operators: the Transform/Accumulator contract, and the built-in shuffle, pack and text
operators."""
