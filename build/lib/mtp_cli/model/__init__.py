"""Model code: the trunk (kept at inference), MTP modules/heads, the loss, and HF export/import."""

from mtp_cli.model.mtp import MTPModel, Output, parallel_backward
from mtp_cli.model.trunk import Block, Trunk

__all__ = ["Block", "MTPModel", "Output", "Trunk", "parallel_backward"]
