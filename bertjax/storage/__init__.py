"""Files wherever a user points (local or gs://), text files, and transformers
directories' weights and configs: the floor every other part reads and writes through."""
