"""BERT-family encoders for pooling: BertModel, BertForSequenceClassification
(cross-encoders), XLMRobertaModel and XLMRobertaForSequenceClassification.

Post-LayerNorm blocks: self-attention over the whole sequence (bidirectional, packed, no KV
cache: attention/encoder.py), a GELU MLP, each added to its input and then normalized.
Modules carry Hugging Face's names, so a checkpoint loads by name (a "bert." prefix of the
classifier checkpoints dropped). The embeddings add word, absolute position and token type
0 vectors (a single text; pairs for cross-encoders pass their token types). RoBERTa counts
positions from padding_idx + 1 and classifies through its own two-layer head.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from pagedllm.layers.activation import apply_activation
from pagedllm.layers.attention import EncoderAttention
from pagedllm.layers.embedding import VocabEmbedding
from pagedllm.layers.linear import Linear, default_weight_loader
from pagedllm.models.spec import activation_of
from pagedllm.pooling.pooler import first_token_rows


class BertEmbeddings(nn.Module):
    """word + position + token type embeddings, then LayerNorm."""

    def __init__(self, config: Any, position_offset: int = 0) -> None:
        super().__init__()
        hidden = config.hidden_size
        # RoBERTa's position ids start after its padding index.
        self.position_offset = position_offset
        self.word_embeddings = VocabEmbedding(config.vocab_size, hidden)
        self.position_embeddings = VocabEmbedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = VocabEmbedding(config.type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """[T] ids, positions (from 0 in each sequence) and token types → [T, hidden]."""
        positions = positions + self.position_offset if self.position_offset else positions
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings(token_type_ids))


class BertSelfAttention(nn.Module):
    """q, k, v projections (with biases) and bidirectional attention."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.query = Linear(hidden, hidden, bias=True)
        self.key = Linear(hidden, hidden, bias=True)
        self.value = Linear(hidden, hidden, bias=True)
        self.attn = EncoderAttention(self.num_heads, self.head_size, self.head_size**-0.5)

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """[T, hidden] → [T, hidden] (before the output projection)."""
        shape = (x.shape[0], self.num_heads, self.head_size)
        q, k, v = (proj(x).view(shape) for proj in (self.query, self.key, self.value))
        return self.attn(q, k, v, seq_lens)


class BertDenseNorm(nn.Module):
    """dense, then LayerNorm of (that + the block's input): BERT's post-norm residual."""

    def __init__(self, config: Any, input_size: int) -> None:
        super().__init__()
        self.dense = Linear(input_size, config.hidden_size, bias=True)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """LayerNorm(dense(x) + residual)."""
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    """Self-attention with its output projection and post-norm."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertDenseNorm(config, config.hidden_size)

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        return self.output(self.self(x, seq_lens), x)


class BertIntermediate(nn.Module):
    """The MLP's up projection and activation."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.activation = activation_of(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] → [T, intermediate]."""
        return apply_activation(self.activation, self.dense(x))


class BertLayer(nn.Module):
    """One encoder block."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertDenseNorm(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        x = self.attention(x, seq_lens)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    """The stack of blocks."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """[T, hidden] → [T, hidden]."""
        for layer in self.layer:
            x = layer(x, seq_lens)
        return x


class BertPooler(nn.Module):
    """BERT's own pooler: tanh(dense(the CLS token's hidden state))."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(self, cls_states: torch.Tensor) -> torch.Tensor:
        """[B, hidden] → [B, hidden]."""
        return torch.tanh(self.dense(cls_states))


class BertModel(nn.Module):
    """HF `BertModel`: packed sequences in, every token's last hidden state out.

    Args:
        config: the HF BertConfig.
        add_pooler: build BERT's pooler too (the classifier uses it; embedding checkpoints
            may not carry it).
    """

    is_encoder = True

    # The prefix of this model's tensors in its task checkpoints ("bert." in a classifier's).
    checkpoint_prefix = "bert."

    def __init__(self, config: Any, add_pooler: bool = False, position_offset: int = 0) -> None:
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError("BERT with relative position embeddings is not supported.")
        self.config = config
        self.embeddings = BertEmbeddings(config, position_offset)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooler else None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: list[int],
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T] ids and positions of sequences packed back to back → [T, hidden]."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, positions, token_type_ids)
        return self.encoder(x, seq_lens)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors (a classifier checkpoint's "bert." prefix dropped); return
        the names filled."""
        prefix = self.checkpoint_prefix
        return load_by_name(self, ((n.removeprefix(prefix), t) for n, t in weights))


class XLMRobertaModel(BertModel):
    """HF `XLMRobertaModel`: BERT's blocks, positions counted from padding_idx + 1."""

    checkpoint_prefix = "roberta."

    def __init__(self, config: Any, add_pooler: bool = False) -> None:
        super().__init__(config, add_pooler, position_offset=config.pad_token_id + 1)


class RobertaClassificationHead(nn.Module):
    """RoBERTa's classifier: dense, tanh, out_proj on the first (<s>) token."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=True)
        self.out_proj = Linear(config.hidden_size, config.num_labels, bias=True)

    def forward(self, first_states: torch.Tensor) -> torch.Tensor:
        """[B, hidden] → [B, num_labels]."""
        return self.out_proj(torch.tanh(self.dense(first_states)))


class _EncoderClassifier(nn.Module):
    """An encoder (under its checkpoint's attribute name) with a head scoring each
    sequence's first token: one row of logits per sequence. Subclasses say which encoder
    and which head."""

    is_encoder = True

    def encoder_model(self) -> BertModel:
        """The encoder."""
        raise NotImplementedError

    def head(self, first_states: torch.Tensor) -> torch.Tensor:
        """[B, hidden] first-token states → [B, num_labels] logits."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: list[int],
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T] packed tokens (token types 1 on a pair's second text) → [T, hidden]."""
        return self.encoder_model()(input_ids, positions, seq_lens, token_type_ids)

    def classify(self, hidden_states: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """[T, hidden] → [num_seqs, num_labels] logits, from each sequence's first token."""
        return self.head(hidden_states[first_token_rows(seq_lens)])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; return the names filled."""
        return load_by_name(self, weights)


class BertForSequenceClassification(_EncoderClassifier):
    """HF `BertForSequenceClassification` (cross-encoders, classifiers): the CLS token
    through BERT's pooler and a linear classifier."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooler=True)
        self.classifier = Linear(config.hidden_size, config.num_labels, bias=True)

    def encoder_model(self) -> BertModel:
        """The encoder."""
        return self.bert

    def head(self, first_states: torch.Tensor) -> torch.Tensor:
        """BERT's pooler, then the classifier."""
        assert self.bert.pooler is not None
        return self.classifier(self.bert.pooler(first_states))


class XLMRobertaForSequenceClassification(_EncoderClassifier):
    """HF `XLMRobertaForSequenceClassification` (e.g. BGE rerankers): the <s> token through
    RoBERTa's classification head."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.roberta = XLMRobertaModel(config)
        self.classifier = RobertaClassificationHead(config)

    def encoder_model(self) -> BertModel:
        """The encoder."""
        return self.roberta

    def head(self, first_states: torch.Tensor) -> torch.Tensor:
        """RoBERTa's classification head."""
        return self.classifier(first_states)


def load_by_name(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Load each tensor into `module`'s parameter of the same name through its weight
    loader (shapes checked there); unknown names, such as position-id buffers or a pooler
    the module does not use, are skipped. Returns the names filled."""
    params = dict(module.named_parameters())
    loaded = set()
    for name, tensor in weights:
        param = params.get(name)
        if param is None:
            continue
        getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        loaded.add(name)
    return loaded
