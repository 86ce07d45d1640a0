"""Writes a tiny llama model with random weights as one GGUF file, for the real
OpenAI-compatible server of the tests (llama-cpp-python, tests/servers/llamacpp.py).

    python tiny_llama_gguf.py OUT.gguf      (needs numpy and gguf; no download)

The model is 2 layers, hidden size 64, 4 heads, float32, about 1400 tokens; the weights are
drawn from a fixed seed, so the file is the same on every machine. Its SentencePiece-style
vocabulary makes lengths exact for the tests:

- ``<unk>`` 0, ``<s>`` 1 (BOS), ``</s>`` 2 (EOS), the 256 byte tokens ``<0x00>``..``<0xFF>``,
  ``▁`` and every printable ASCII character (so that any prompt tokenizes), then the words
  ``▁w0``..``▁w999`` with every prefix of them (``▁w``, ``▁w1``, ``▁w12``), so that the
  text ``w12 w5`` is the two tokens ``▁w12 ▁w5``: one token per word of ``w0``..``w999``,
  the words of the word-level tokenizer the tests give loadgen (``WORDS``).
- Generation can only produce the words and EOS: hidden dimension 0 of every embedding is
  a large constant, which normalisation keeps large and positive, and each other token's
  output row has a large negative weight there. So every generated token is one streamed
  chunk with non-empty text (no byte pieces held back, no control tokens), and a request
  ends either at EOS (about 1 token in 25 here, sometimes the first) or at ``max_tokens``; with ``min_tokens``
  equal to ``max_tokens`` (loadgen's ``--ignore-eos``) it is always ``max_tokens``.
"""

from __future__ import annotations

import sys

import numpy as np

WORDS = 1000
"""The words w0..w{WORDS-1} are one token each."""
N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 2048
CONST = 8.0  # hidden dimension 0 of every token embedding
EOS_WEIGHT = 0.72  # EOS's output weight on dimension 0: about 1 token in 25 is EOS
BANNED_WEIGHT = -10.0  # every token that is neither a word nor EOS
SEED = 20240601

# gguf's TokenType values (NORMAL 1, UNKNOWN 2, CONTROL 3, BYTE 6)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


def vocabulary() -> tuple:
    """(pieces, scores, types, indices of the word tokens)."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    pieces += ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    types += [NORMAL] * (1 + 0x7F - 0x21)
    pieces.append("\u2581w")
    types.append(NORMAL)
    first_word = len(pieces)
    pieces += [f"\u2581w{i}" for i in range(WORDS)]  # prefix-closed: w1 is a prefix of w12
    types += [NORMAL] * WORDS
    # Longer pieces score higher, as a SentencePiece model's merges would have them.
    scores = [0.0] * 3 + [-1000.0] * 256 + [-100.0 + len(p) for p in pieces[259:]]
    return pieces, scores, types, range(first_word, first_word + WORDS)


def write(path: str) -> None:
    import gguf  # in the server's own environment (install_llamacpp.sh)

    pieces, scores, types, words = vocabulary()
    n_vocab = len(pieces)
    rng = np.random.default_rng(SEED)
    f32 = np.float32

    def rand(*shape: int, sd: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * sd).astype(f32)

    embd = rand(n_vocab, N_EMBD, sd=1.0)
    embd[:, 0] = CONST
    out = rand(n_vocab, N_EMBD, sd=0.3)
    out[:, 0] = BANNED_WEIGHT
    out[list(words), 0] = 0.0
    out[2, :] = 0.0
    out[2, 0] = EOS_WEIGHT

    w = gguf.GGUFWriter(path, "llama")
    w.add_name("loadgen-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all float32
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    w.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, f32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, f32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, f32))
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.gguf")
    write(sys.argv[1])
