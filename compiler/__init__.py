"""celosia.compiler"""
