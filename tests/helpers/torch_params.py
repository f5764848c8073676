"""Random parameters for a transformers (torch) model: every parameter drawn, so that no bias
is zero and no norm's weight one. Imported by the parity and integration tiers only."""

import pytest

torch = pytest.importorskip("torch")


def randomize_torch(module, seed: int = 0, std: float = 0.2):
    """`module` with every parameter normal(0, std), 1 + that for its LayerNorm and norm
    weights, in evaluation mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32) * std
            is_norm = "norm.weight" in name or "LayerNorm.weight" in name
            p.copy_((1.0 + noise) if is_norm else noise)
    return module.eval()
