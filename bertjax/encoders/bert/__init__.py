"""BERT (Devlin et al. 2019) as an encoder family: post-LayerNorm layers, a tanh pooler on
[CLS], a masked-LM head tied to the word embeddings and a next-sentence head.

    config.py        BertConfig, its presets and the fields that fix what the weights mean
    model.py         the linen modules (einsum letters documented at its top); ELECTRA's
                     encoder and the seq2seq decoder build on its layers
    hf.py            config.json and the tensor map of transformers' Bert* classes, and
                     whole directories in and out
    family.py        the EncoderFamily the capabilities use
"""
