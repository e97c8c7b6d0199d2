"""Benchmarks, each printing one JSON object with ratios against a baseline
measured in the same run: ``python -m radixcache.cli.bench NAME [--quick]``."""
