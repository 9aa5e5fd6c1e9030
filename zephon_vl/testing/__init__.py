"""Test kit shipped for users' own checks: TorchTitan on CPU, a tiny model, a DCP round trip,
test videos. Not needed to load data."""
