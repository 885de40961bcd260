"""Benchmarks behind `opfacade bench`: one module per op family, each returning BenchRows."""
