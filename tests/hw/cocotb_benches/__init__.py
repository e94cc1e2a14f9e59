"""cocotb 2.x benches of the RTL blocks (run from tests/hw/test_cocotb_blocks.py).

Every block instance the benches drive lives in one Verilog top (top.py), so one Verilator
build serves every bench; each bench_*.py module compares one kind of block against its
naive Python model with random data, random back-pressure and random memory latency.
"""
