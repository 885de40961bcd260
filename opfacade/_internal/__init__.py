"""Internals: tensor wrapping, streams, devices, caches. Nothing here is public API."""
