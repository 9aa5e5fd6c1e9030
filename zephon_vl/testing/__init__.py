"""Test kit shipped for users' own checks: TorchTitan on CPU, a tiny model, a DCP round trip,
test videos, storage servers on 127.0.0.1 (S3, GCS, HTTP with Range), a two-node Ray cluster
on 127.0.0.1 (`ray_cluster`). Not needed to load data."""
