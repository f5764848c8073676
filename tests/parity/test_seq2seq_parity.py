"""The parity tests of test_seq2seq.py (tests/unit/), with the transformers helpers they share
with tests/integration/test_seq2seq_runs.py."""

import numpy as np
import torch
import transformers

from bertjax.tasks.seq2seq import hf as seq2seq_hf
from tests.helpers.seq2seq import CONFIG, EOS, START, VOCAB, logits_of, random_params, sources  # noqa: F401
from tests.helpers.seq2seq_torch import hf_model  # noqa: F401


def hf_logits(model, ids, mask, decoder_ids):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            decoder_input_ids=torch.tensor(decoder_ids),
        )
    return out.logits.numpy()


def test_logits_match_transformers_both_ways(tmp_path):
    params = random_params()
    ids, mask = sources(8)
    decoder_ids = np.array(sources(9)[0][:, :6])
    seq2seq_hf.save_seq2seq(CONFIG, params, tmp_path / "ours")
    theirs = hf_model(tmp_path / "ours")
    ours = logits_of(params, ids, mask, decoder_ids)
    np.testing.assert_allclose(hf_logits(theirs, ids, mask, decoder_ids), ours, atol=1e-4)
    config_json = theirs.config
    assert (config_json.decoder_start_token_id, config_json.pad_token_id) == (START, 0)
    assert theirs.decoder.config.is_decoder and theirs.decoder.config.add_cross_attention

    # transformers' own random model, read by bertjax.
    torch.manual_seed(0)
    encoder = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        initializer_range=0.2,
    )
    decoder = transformers.BertConfig(
        **{**encoder.to_dict(), "is_decoder": True, "add_cross_attention": True}
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.eos_token_id, config.pad_token_id = START, EOS, 0
    model = transformers.EncoderDecoderModel(config=config).eval()
    model.save_pretrained(tmp_path / "theirs")
    loaded_config, loaded = seq2seq_hf.load_seq2seq(tmp_path / "theirs")
    assert (loaded_config.decoder_start_id, loaded_config.eos_id) == (START, EOS)
    np.testing.assert_allclose(
        logits_of(loaded, ids, mask, decoder_ids, loaded_config),
        hf_logits(model, ids, mask, decoder_ids),
        atol=1e-4,
    )
    # And back: the round trip writes the same tensors transformers wrote.
    seq2seq_hf.save_seq2seq(loaded_config, loaded, tmp_path / "again")
    again = hf_model(tmp_path / "again").state_dict()
    for name, tensor in model.state_dict().items():
        np.testing.assert_array_equal(again[name].numpy(), tensor.numpy(), err_msg=name)
