"""Helpers the tests share: an official-layout OpenVLA/OFT checkpoint writer and fault injection."""
