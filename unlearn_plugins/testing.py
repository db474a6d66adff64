"""A tiny Llama and tokenizer built in code, for fast tests (ours and plugin authors').

The tokenizer is a byte-level BPE trained in memory on a small corpus with a
ChatML chat template and the same special tokens as SmolLM2, so formatting and
label masks behave as with the real model.
"""

from __future__ import annotations

_CORPUS = (
    "What is the full name of the author born in Kuwait City? The author is Basil Mahfouz Al-Kuwaiti. "
    "Which genre does the author write in? She writes fantasy novels and short stories about the sea. "
    "Who are the parents of the author? Her father was a doctor and her mother was a painter. "
    "What awards has the author won? He won the International Booker Prize for his debut novel. "
    "The capital of France is Paris. I don't know the answer to that question. "
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()-/"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 384):
    """A PreTrainedTokenizerFast with ChatML template; pad = eos = <|im_end|> as in SmolLM2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(
    vocab_size: int = 384,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
):
    """A randomly initialised LlamaForCausalLM with grouped-query attention (fp32, eval mode)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def save_tiny_model(folder, **kwargs):
    """Write a tiny model + tokenizer as a Hugging Face folder (for CLI tests)."""
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), **kwargs)
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
