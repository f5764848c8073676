"""ModernBERT-base pretrained by replaced-token detection: configs/modernbert_base.py (its
architecture and recipe, phase 1) with one field changed, `objective = "rtd"`. The generator
is a quarter of the discriminator's width (192, three heads; ELECTRA's recommendation for
base and large, Clark et al. 2020, Section 3.2), lambda 50; the recipe's 30% masking is kept
(ELECTRA-Large raised its rate from 15% to 25%; set --config.data.masked_lm_prob=0.15 for
ELECTRA-Base's). The context phase (configs/modernbert_base_context.py) continues such a run
as it continues a masked-LM one, with the same field.

    python train.py --config configs/modernbert_rtd_base.py --workdir gs://bucket/mb_rtd_base \\
        --config.data.input='gs://bucket/corpus/*.txt'
"""

from configs import modernbert_base


def get_config():
    config = modernbert_base.get_config()
    config.objective = "rtd"
    return config
