"""mtp: train NTP vs multi-token-prediction models, evaluate the trunk, benchmark MTP drafting."""

__version__ = "0.1.0"
