"""A tiny Llama model directory that vLLM serves with random weights, for tests and the demo.

``ensure_tiny_model`` writes ``config.json`` (a 2-layer Llama, hidden 256, 4 heads / 2 KV heads,
vocab 4096, 4096 positions, float32), ``generation_config.json`` and a byte-level BPE tokenizer
(``tokenizer.json`` + ``tokenizer_config.json`` with a chat template). There are no weights: the
server loads it with ``--load-format dummy``, so the output is noise, but prompts are tokenized,
cached in KV blocks, scheduled and metered exactly as for a real model.

The tokenizer is trained here, deterministically, on the source text of a fixed list of standard
library modules (present on every Python install, no network). The bytes of ``tokenizer.json``
are the same on every run for given standard-library sources and ``tokenizers`` version; another
Python release may give another (equally valid) tokenizer.

BOS is *not* added by the tokenizer (no post-processor, ``add_bos_token`` false) and the chat
template does not emit it: the token ids vLLM computes for a prompt, with or without special
tokens, are exactly ``Tokenizer.from_file(tokenizer.json).encode(text).ids``, so a router that
hashes prompt blocks from this tokenizer sees the blocks the engine caches. ``</s>`` is the EOS
token and ends every chat turn.

This module runs in the control plane's environment (``tokenizers``, ``jinja2``); the engine's
environment only reads the files.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from infra.files import write_atomic

# Bump whenever anything written below changes: a directory with another version is rebuilt.
FORMAT_VERSION = 1
MARKER = ".tiny-model.json"

VOCAB_SIZE = 4096
MAX_MODEL_LEN = 4096
BOS = "<s>"
EOS = "</s>"

# Modules whose source is the training text: sorted, each present in every CPython build.
CORPUS_MODULES = (
    "argparse",
    "ast",
    "asyncio.events",
    "asyncio.tasks",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "gettext",
    "heapq",
    "http.client",
    "http.server",
    "inspect",
    "ipaddress",
    "json.decoder",
    "json.encoder",
    "logging",
    "pathlib",
    "pprint",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "tokenize",
    "typing",
    "unittest.case",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "zipfile",
)

# Roles and turns as plain text; no BOS, so it renders the same whatever the tokenizer adds.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    # float32: fastest on CPUs without AVX512-BF16, where bfloat16 is emulated. Serve it with
    # `--dtype float32`: vLLM's "auto" downcasts a float32 config to bfloat16.
    "dtype": "float32",
}

GENERATION_CONFIG: dict[str, Any] = {"bos_token_id": 0, "eos_token_id": 1}

TOKENIZER_CONFIG: dict[str, Any] = {
    # The generic fast tokenizer: loads tokenizer.json as is (a Llama class would rebuild it).
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": BOS,
    "eos_token": EOS,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": MAX_MODEL_LEN,
    "chat_template": CHAT_TEMPLATE,
}


def ensure_tiny_model(directory: Path, name: str = "tiny-llama") -> Path:
    """Make ``directory`` hold the tiny model (created if missing) and return it.

    Idempotent: a directory already built by this recipe version for ``name`` is left as it is
    (no training); otherwise every file is rewritten, each atomically, the marker last, so an
    interrupted build is redone on the next call. Takes a few seconds when it trains.
    """
    directory = Path(directory)
    marker = {"format": FORMAT_VERSION, "name": name}
    files = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
    if _read_json(directory / MARKER) == marker and all((directory / f).is_file() for f in files):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "config.json", _json(CONFIG))
    _write(directory / "generation_config.json", _json(GENERATION_CONFIG))
    _write(directory / "tokenizer.json", train_tokenizer().to_str(pretty=True))
    _write(directory / "tokenizer_config.json", _json(TOKENIZER_CONFIG))
    _write(directory / MARKER, _json(marker))
    return directory


def train_tokenizer() -> Tokenizer:
    """The byte-level BPE tokenizer (``VOCAB_SIZE`` tokens, ``<s>`` = 0, ``</s>`` = 1), trained
    on ``CORPUS_MODULES``; the same merges on every call."""
    tokenizer = Tokenizer(models.BPE())
    # Byte level: every string encodes (no unknown token) and decodes back to itself.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def corpus() -> list[str]:
    """The training text: the source of each module of ``CORPUS_MODULES``, in that order."""
    texts = []
    for module_name in CORPUS_MODULES:
        try:
            texts.append(inspect.getsource(importlib.import_module(module_name)))
        except (OSError, TypeError) as exc:
            # A Python installed without its .py files: say so instead of training on less.
            raise RuntimeError(
                f"the source of the standard module {module_name} is not available: {exc}"
            ) from exc
    return texts


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, text: str) -> None:
    # Atomic per file: a server reading the directory meanwhile never sees half a file, and two
    # builders racing write the same bytes.
    write_atomic(path, text)
