"""Encoder families beside BERT: one module per family, each with its config, its linen
modules and its mapping to and from transformers' weights."""
