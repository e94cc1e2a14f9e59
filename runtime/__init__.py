"""celosia.runtime"""
