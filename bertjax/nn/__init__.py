"""The encoder families' building blocks, knowing no family.

attention.py      scaled dot-product attention on every backend (xla, blocked CPU
                  kernels, cuDNN, splash) and the choice among them
cpu_attention.py  the two custom-VJP CPU kernels: padding with dropout; documents and
                  sliding windows
masks.py          the masks attention applies: padding, documents, windows, and
                  dropout's counter-based keep mask
low_precision.py  products with low-precision operands summed in float32, both ways
unpadding.py      token packing: an encoder skips padding
pooling.py        token outputs pooled into one vector per row
losses.py         masked-LM and next-sentence losses and accuracies
heads.py          what every fine-tuning head builds on: loss statistics, init, call
sharding.py       the logical axis vocabulary, meshes and the rules between them
"""
