"""celosia.sim"""
