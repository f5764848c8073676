"""ModernBERT (Warner et al. 2024) as an encoder family: rotary positions, GeGLU, pre-LayerNorm
layers, a global layer every few and sliding-window layers between, packed documents.

    config.py        ModernBertConfig, its presets and transformers' config.json both ways
    attention.py     the attention masks (global, sliding window, banded) and the kernels'
    model.py         the linen modules: the encoder with its prediction head, the masked-LM
                     model, the replaced-token head and the generator replaced-token
                     detection trains beside a discriminator
    hf.py            the tensor map of transformers' ModernBert* classes, directories in and
                     out
    family.py        the EncoderFamily the capabilities use
"""
