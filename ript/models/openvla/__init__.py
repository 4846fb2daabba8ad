"""The original (discrete-token) OpenVLA, read from an official ``openvla/openvla-7b`` folder."""
