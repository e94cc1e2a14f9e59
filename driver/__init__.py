"""celosia.driver"""
