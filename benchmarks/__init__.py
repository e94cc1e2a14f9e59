"""celosia.benchmarks"""
