"""bertjax: BERT pretraining in JAX."""
