"""celosia.fpga"""
