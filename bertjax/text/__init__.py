"""Text to model inputs: tokenizers and features.

tokenizer.py           the Tokenizer interface and its three kinds: sentencepiece,
                       WordPiece (vocab.txt) and transformers' tokenizer.json pipelines;
                       the files a transformers directory holds for each
special_tokens.py      BERT's special tokens: pieces, sentencepiece's fixed ids,
                       transformers' names, how a pipeline adds [CLS] and [SEP]
training.py            training a sentencepiece model on a sample of the corpus
sentencepiece_json.py  a sentencepiece model as a `tokenizers` pipeline (tokenizer.json)
directory.py           the tokenizer of a transformers directory or a bertjax export
features.py            single texts and pairs to model inputs: truncation, offsets,
                       length buckets
"""
