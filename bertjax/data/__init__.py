"""Pretraining data: corpus reading, instances, masking, storage and the loader."""
