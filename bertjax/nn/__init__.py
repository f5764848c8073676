"""The encoder families' building blocks: attention per backend, low-precision
products, token unpadding, pooling, losses, heads and the logical sharding axes."""
