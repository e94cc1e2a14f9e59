"""celosia.hw"""
