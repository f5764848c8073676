"""ELECTRA (Clark et al. 2020) as an encoder family: BERT's encoder without a pooler, its
embeddings at their own width projected to the hidden size.

    config.py        ElectraConfig (BERT's fields, embedding_size, classifier_dropout)
    model.py         the linen modules: the encoder (BERT's embeddings and layers), the
                     generator's and the discriminator's heads, and the generator
                     replaced-token detection trains beside a discriminator
    hf.py            config.json and the tensor map of transformers' Electra* classes
    family.py        the EncoderFamily the capabilities use
"""
