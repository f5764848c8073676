"""ELECTRA's replaced-token detection module, where the objective's first users found it; it
lives with its family (bertjax.encoders.electra.rtd), as every family's does."""

from bertjax.encoders.electra.rtd import ReplacedTokenDetection, init

__all__ = ["ReplacedTokenDetection", "init"]
