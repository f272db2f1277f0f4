"""Models and tokenizers: a tiny Llama trained from scratch, LoRA, and loading a pretrained model.

The tiny model is a ``LlamaForCausalLM`` built from a ``LlamaConfig``; the tokenizer is a word-level
``PreTrainedTokenizerFast`` whose vocabulary is the task's words. Why Llama and not Qwen2: with a
``qwen2`` config, ``AutoTokenizer.from_pretrained(folder)`` silently substitutes a byte-level Qwen2
tokenizer for our word-level one (see ``reference/stack.md``); with Llama it round-trips exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

__all__ = [
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "build_tokenizer",
    "build_model",
    "add_lora",
    "add_special_tokens",
    "load_pretrained",
    "get_device",
    "count_parameters",
]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, "<|im_start|>", "<|im_end|>"]
# Words the chat template itself uses must be in the vocabulary, or they become <unk>.
CHAT_WORDS = ["system", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tokenizer(
    words: Iterable[str], *, extra_special_tokens: Iterable[str] = ()
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: every whitespace-separated word of the task is one token.

    Ids are assigned in a fixed order (special tokens, then ``extra_special_tokens``, then the
    sorted words), so the same vocabulary always gives the same ids. Encoding prepends ``<bos>``;
    decoding joins words with spaces. Padding is on the left, as decoder-only generation needs.
    """
    extra = [t for t in extra_special_tokens if t not in SPECIAL_TOKENS]
    specials = SPECIAL_TOKENS + extra
    vocab_words = sorted((set(words) | set(CHAT_WORDS)) - set(specials))
    for w in vocab_words:
        if not w or any(c.isspace() for c in w):
            raise ValueError(
                f"vocabulary words must be non-empty and contain no whitespace, got {w!r}"
            )
    vocab = {tok: i for i, tok in enumerate(specials + vocab_words)}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins tokens with single spaces
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
    tok.add_special_tokens({"additional_special_tokens": specials[4:]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 128,
    seed: int | None = None,
) -> LlamaForCausalLM:
    """A small Llama decoder initialised from scratch (about 1M parameters with the defaults).

    Input and output embeddings are tied; attention uses PyTorch SDPA (no custom kernels, so it runs
    on CPU, any GPU and MPS). The generation config samples at temperature 1 with no top-k/top-p,
    i.e. from the policy itself, which is what the policy-gradient estimators assume.
    """
    if seed is not None:
        torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    model.generation_config = default_generation_config(tokenizer)
    return model


def default_generation_config(tokenizer) -> GenerationConfig:
    return GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )


def add_lora(
    model,
    *,
    r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    trainable_token_ids: list[int] | None = None,
):
    """Wrap ``model`` with LoRA adapters (peft); only the adapters are trainable afterwards, and
    the embedding rows of ``trainable_token_ids`` (tokens added for the task, e.g. the RC-GRPO
    chapter's reward tokens: peft's ``trainable_token_indices``)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
        trainable_token_indices={"embed_tokens": list(trainable_token_ids)}
        if trainable_token_ids
        else None,
    )
    return get_peft_model(model, config)


def add_special_tokens(model, tokenizer, tokens: Iterable[str]) -> list[int]:
    """Add ``tokens`` to the tokenizer as special tokens (never split, one id each) and grow the
    model's embedding to match; return their ids.

    New embedding rows are drawn around the mean of the old ones (``mean_resizing``, from the
    global torch stream): a new token starts as an average word, not as an outlier. Tokens already
    in the vocabulary are left as they are. Call it before wrapping the model with LoRA, and pass
    the ids to :func:`add_lora` so that their rows are trained.
    """
    tokens = list(tokens)
    tokenizer.add_tokens([t for t in tokens if t not in tokenizer.get_vocab()], special_tokens=True)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return tokenizer.convert_tokens_to_ids(tokens)


def load_pretrained(
    name_or_path: str, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
):
    """Load a causal LM and its tokenizer by hub name or from a local folder:
    ``(model, tokenizer)``.

    A hub name needs network access (Colab, a GPU box); tests exercise the same code path offline
    with a tiny model saved to a folder. The tokenizer gets left padding and a pad token (the EOS
    token when the model has none), and the model a sampling generation config (temperature 1, no
    top-k/top-p).
    """
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if not os.path.isdir(name_or_path) and offline:
        raise FileNotFoundError(
            f"{name_or_path!r} is not a local folder and HF_HUB_OFFLINE=1: cannot download it"
        )
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=dtype or torch.float32, attn_implementation="sdpa"
    )
    model.generation_config = default_generation_config(tokenizer)
    if device is not None:
        model.to(device)
    return model, tokenizer


def get_device(prefer: str | None = None) -> torch.device:
    """``prefer`` if given (``"cpu"``, ``"cuda"``, ``"mps"``),
    else CUDA, then Apple MPS, then CPU."""
    if prefer not in (None, "auto"):
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Number of (trainable) parameters, counting tied weights once."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
