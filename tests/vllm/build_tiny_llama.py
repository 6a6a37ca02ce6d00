"""Build a tiny random-weight Llama model + a locally trained BPE tokenizer.

No network / model hub access needed. Output: a HF-format model dir that
`vllm serve` can load (config.json, model.safetensors, tokenizer.json, ...).
"""

import os
import random
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

OUT = sys.argv[1] if len(sys.argv) > 1 else "build/tiny-llama"
VOCAB = 2048
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3

os.makedirs(OUT, exist_ok=True)
random.seed(0)
torch.manual_seed(0)

# ---- 1. tokenizer: byte-level BPE trained on generated text ----------------
words = (
    "the a an of to in is was for on that with as by at from this it be are "
    "model server request token cache metric health latency queue running "
    "waiting gpu cpu memory hello world answer question quick brown fox jumps "
    "over lazy dog one two three four five six seven eight nine ten"
).split()


def corpus(n=20000):
    for _ in range(n):
        yield " ".join(random.choice(words) for _ in range(random.randint(5, 20))) + "."
    for i in range(2000):
        yield f"{i} + {i + 1} = {2 * i + 1}. Numbers: {random.randint(0, 10**6)}"


tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=VOCAB,
    special_tokens=SPECIALS,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tok.train_from_iterator(corpus(), trainer=trainer)
tok.post_processor = processors.TemplateProcessing(
    single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
)

hf_tok = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token="<s>",
    eos_token="</s>",
    unk_token="<unk>",
    pad_token="<pad>",
    model_max_length=2048,
)
hf_tok.chat_template = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
hf_tok.save_pretrained(OUT)
assert tok.token_to_id("<s>") == 1
assert tok.token_to_id("</s>") == 2

# ---- 2. model: tiny Llama, random init, safetensors ------------------------
# head_dim must be one the vLLM CPU attention backend supports
# (32, 64, 80, 96, ...): hidden 128 / 2 heads = 64.
cfg = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
model = LlamaForCausalLM(cfg).eval()
model.save_pretrained(OUT, safe_serialization=True)
model.generation_config.save_pretrained(OUT)
n = sum(p.numel() for p in model.parameters())
print(f"saved {OUT}: {n / 1e6:.2f}M params, vocab {len(hf_tok)}")
print(sorted(os.listdir(OUT)))
