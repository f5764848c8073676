"""Text to model inputs: tokenizers (sentencepiece, WordPiece, tokenizer.json
pipelines) and features (single texts and pairs, truncation, offsets, buckets)."""
