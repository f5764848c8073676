"""Storage: the floor every other part of bertjax reads and writes through.

fs.py        files wherever a user points, a local path or gs://bucket/path: reads,
             atomic writes, globs, retries of transient GCS failures, one-line errors
textfile.py  text files as both corpora and task files read them: encodings, BOMs,
             compression, line counts
hf.py        transformers directories, whatever the family: safetensors (and
             pytorch_model.bin), config.json, the tensor-spec vocabulary each family's
             tensor map is written in, a directory staged locally and uploaded whole
"""
