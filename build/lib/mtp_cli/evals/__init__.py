"""Evaluations of a trained trunk (MTP modules discarded) and of the MTP modules' predictions."""
