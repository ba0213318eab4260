"""Which tensors outside the layer stack a `slices:` merge takes from the first slice and which
from the last: mergekit's "pre" and "post" weights of its architectures.

The two tables are mergekit 0.1.5's `pre_weights` and `post_weights` (its
`_data/architectures/*.json`, every architecture's names together: no name is "pre" in one and
"post" in another); a test holds them equal to the installed mergekit's files. A name neither
lists (an architecture mergekit does not know) is judged by its words: embeddings are "pre".
"""

from __future__ import annotations

import re

PRE_WEIGHTS = frozenset(
    {
        "backbone.embeddings.weight",
        "bert.embeddings.LayerNorm.bias",
        "bert.embeddings.LayerNorm.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.position_ids",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.word_embeddings.weight",
        "distilbert.embeddings.LayerNorm.bias",
        "distilbert.embeddings.LayerNorm.weight",
        "distilbert.embeddings.position_embeddings.weight",
        "distilbert.embeddings.word_embeddings.weight",
        "embeddings.LayerNorm.bias",
        "embeddings.LayerNorm.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.position_ids",
        "embeddings.token_type_embeddings.weight",
        "embeddings.word_embeddings.weight",
        "gpt_neox.embed_in.weight",
        "layers.0.wte.weight",
        "model.embed_tokens.weight",
        "model.embedding_norm.weight",
        "model.tok_embeddings.weight",
        "roberta.embeddings.LayerNorm.bias",
        "roberta.embeddings.LayerNorm.weight",
        "roberta.embeddings.position_embeddings.weight",
        "roberta.embeddings.position_ids",
        "roberta.embeddings.token_type_embeddings.weight",
        "roberta.embeddings.word_embeddings.weight",
        "transformer.embd.wte.weight",
        "transformer.embedding.word_embeddings.weight",
        "transformer.relative_pe.slopes",
        "transformer.rotary_pos_emb.inv_freq",
        "transformer.word_embeddings.weight",
        "transformer.wpe.weight",
        "transformer.wte.weight",
    }
)

POST_WEIGHTS = frozenset(
    {
        "backbone.norm_f.weight",
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
        "classifier.bias",
        "classifier.dense.bias",
        "classifier.dense.weight",
        "classifier.out_proj.bias",
        "classifier.out_proj.weight",
        "classifier.weight",
        "cls.predictions.bias",
        "cls.predictions.decoder.weight",
        "embed_out.weight",
        "gpt_neox.final_layer_norm.bias",
        "gpt_neox.final_layer_norm.weight",
        "layers.${num_layers}.linear.bias",
        "layers.${num_layers}.linear.weight",
        "layers.${num_layers}.ln.bias",
        "layers.${num_layers}.ln.weight",
        "lm_head.bias",
        "lm_head.decoder.weight",
        "lm_head.dense.bias",
        "lm_head.dense.weight",
        "lm_head.layer_norm.bias",
        "lm_head.layer_norm.weight",
        "lm_head.linear.bias",
        "lm_head.linear.weight",
        "lm_head.ln.bias",
        "lm_head.ln.weight",
        "lm_head.weight",
        "model.final_layernorm.bias",
        "model.final_layernorm.weight",
        "model.norm.bias",
        "model.norm.weight",
        "output.weight",
        "pooler.dense.bias",
        "pooler.dense.weight",
        "pre_classifier.bias",
        "pre_classifier.weight",
        "score.bias",
        "score.weight",
        "transformer.encoder.final_layernorm.weight",
        "transformer.ln_f.bias",
        "transformer.ln_f.weight",
        "transformer.output_layer.weight",
        "vocab_layer_norm.bias",
        "vocab_layer_norm.weight",
        "vocab_projector.bias",
        "vocab_projector.weight",
        "vocab_transform.bias",
        "vocab_transform.weight",
    }
)

# Embeddings by name, for architectures the tables do not list.
_PRE_WORDS = re.compile(r"embed|wte|wpe|position|token_type")


def is_pre_weight(name: str) -> bool:
    """Whether `name` (a tensor outside the layer stack) comes before the stack, as mergekit
    takes it from the first slice; otherwise it comes after, from the last slice."""
    if name in PRE_WEIGHTS or name in POST_WEIGHTS:
        return name in PRE_WEIGHTS
    return _PRE_WORDS.search(name) is not None
