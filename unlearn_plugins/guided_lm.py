"""A causal LM whose next-token distribution is tilted by a trained guidance head on its frozen
hidden states: T3, "Temper-Then-Tilt" (Block et al., ICML 2026; open-unlearning
``src/model/t3.py``). The head reads the running mean of the last hidden states up to each
position and gives one logit per vocabulary token (does this continuation belong to the retain
side); the logits are

    log_softmax(base_logits) / base_temp + guidance_scale * logsigmoid(head(mean_pool(h)))

whose softmax is the tempered base distribution tilted by the head's retain probability.

The model is saved whole (``model_type`` ``unlearn_t3``: the base model's weights under
``base_lm.``, the head under ``guidance_head.``) and registered with transformers' Auto classes
when this module is imported (:func:`unlearn_plugins.models.from_pretrained` imports it): a saved
T3 model loads as itself, never silently as its base model. Its logits pool the whole sequence, so
it takes no key/value cache in ``forward`` (evaluation scores it with whole sequences); its
``generate`` keeps the running sums itself, as the reference's cached generation does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .errors import UnlearnError

MODEL_TYPE = "unlearn_t3"
IGNORE_INDEX = -100
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "id": nn.Identity}


class GuidanceHead(nn.Module):
    """Linear(hidden -> hidden_size), activation, (num_hidden_layers - 1) more such layers, then
    Linear(hidden_size -> vocab) without bias (the reference's DataSplitClassifier)."""

    def __init__(self, input_dim, output_dim, hidden_size=100, num_hidden_layers=1, activation_str="id", bias=False):
        super().__init__()
        if activation_str not in ACTIVATIONS:
            raise UnlearnError(
                f"T3 guidance head: activation_str must be one of {', '.join(ACTIVATIONS)}, got {activation_str!r}"
            )
        if num_hidden_layers > 1 and activation_str == "id":
            raise UnlearnError(
                "T3 guidance head: more than one hidden layer with the identity activation is one linear map"
            )
        act = ACTIVATIONS[activation_str]
        layers: list[nn.Module] = [nn.Linear(input_dim, hidden_size, bias=bias), act()]
        for _ in range(num_hidden_layers - 1):
            layers += [nn.Linear(hidden_size, hidden_size, bias=bias), act()]
        layers.append(nn.Linear(hidden_size, output_dim, bias=False))
        self.proj = nn.Sequential(*layers)

    def forward(self, hidden):
        b, t, h = hidden.shape
        return self.proj(hidden.reshape(-1, h)).view(b, t, -1)

    def target_token_logits(self, hidden, token_ids):
        """The logit of ``token_ids[b, t]`` only, at each position (no vocabulary-wide output)."""
        b, t, h = hidden.shape
        x = hidden.reshape(-1, h)
        for layer in self.proj[:-1]:
            x = layer(x)
        weights = self.proj[-1].weight.index_select(0, token_ids.reshape(-1).long())
        return (x * weights).sum(-1).view(b, t)


def mean_pool(hidden, attention_mask=None):
    """The mean of ``hidden`` over the unmasked positions up to each position (B, T, H)."""
    if attention_mask is None:
        n = torch.arange(1, hidden.shape[1] + 1, device=hidden.device).view(1, -1, 1)
        return hidden.cumsum(dim=1) / n
    mask = attention_mask.to(device=hidden.device, dtype=hidden.dtype).unsqueeze(-1)
    return (hidden * mask).cumsum(dim=1) / mask.cumsum(dim=1).clamp_min(1)


class T3Config(PretrainedConfig):
    """The base model's configuration (``base_config``) and the guidance settings."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        base_config: dict | None = None,
        guidance: dict | None = None,
        pooling: str = "mean",
        extraction_layer: int = -1,
        guidance_scale: float = 1.0,
        base_temp: float = 1.0,
        **kwargs,
    ):
        self.base_config = dict(base_config or {})
        self.guidance = dict(guidance or {})
        self.pooling = pooling
        self.extraction_layer = extraction_layer
        self.guidance_scale = guidance_scale
        self.base_temp = base_temp
        for key in (
            "hidden_size",
            "vocab_size",
            "max_position_embeddings",
            "eos_token_id",
            "pad_token_id",
            "bos_token_id",
        ):
            if key in self.base_config:
                kwargs.setdefault(key, self.base_config[key])
        kwargs["tie_word_embeddings"] = False  # ties live inside the base model
        super().__init__(**kwargs)

    def to_base(self) -> PretrainedConfig:
        values = dict(self.base_config)
        return AutoConfig.for_model(values.pop("model_type"), **values)


class T3CausalLM(PreTrainedModel):
    """A frozen causal LM (``base_lm``, eval mode, no gradients) and a trainable guidance head."""

    config_class = T3Config
    base_model_prefix = "t3"
    needs_whole_sequences = True  # evaluation scores it without a prompt cache (scoring 'hf')
    _supports_sdpa = True

    def __init__(self, config: T3Config, base_lm=None):
        super().__init__(config)
        self.base_lm = base_lm if base_lm is not None else AutoModelForCausalLM.from_config(config.to_base())
        self.base_lm.eval()
        self.base_lm.requires_grad_(False)
        if config.pooling != "mean":
            raise UnlearnError(f"T3: pooling {config.pooling!r} is not supported (only 'mean', as the reference)")
        param = next(self.base_lm.parameters())
        self.guidance_head = GuidanceHead(config.hidden_size, config.vocab_size, **config.guidance).to(
            device=param.device, dtype=param.dtype
        )
        self.generation_config = getattr(self.base_lm, "generation_config", None) or GenerationConfig()
        self.post_init()  # transformers' bookkeeping (tied weights of the base); _init_weights changes nothing

    @classmethod
    def from_base(cls, base_lm, **settings) -> "T3CausalLM":
        """Wrap an already loaded model (its weights are shared, not copied)."""
        config = T3Config(base_config=base_lm.config.to_dict(), **settings)
        return cls(config, base_lm=base_lm)

    def _init_weights(self, module):  # the base is loaded, the head keeps torch's own init
        pass

    def can_generate(self) -> bool:
        return True

    def train(self, mode: bool = True):
        super().train(mode)
        self.base_lm.eval()  # the base model stays in eval mode (no dropout), as the reference
        return self

    def guide(self, base_logits, classifier_logits):
        """log_softmax(base) / base_temp + guidance_scale * logsigmoid(classifier) (fp32)."""
        base = torch.log_softmax(base_logits.float(), dim=-1)
        return base / self.config.base_temp + self.config.guidance_scale * nn.functional.logsigmoid(
            classifier_logits.float()
        )

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        labels=None,
        classifier_only: bool = False,
        past_key_values=None,
        use_cache=None,
        **kwargs,
    ):
        if past_key_values is not None or kwargs.get("cache") is not None:
            raise UnlearnError(
                "a T3 model pools the whole sequence at every position: it cannot continue from a "
                "key/value cache (score it with whole sequences, e.g. scoring 'hf')"
            )
        if classifier_only:
            return self._classifier_logits(input_ids, attention_mask, labels)
        out = self.base_lm(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False, **kwargs
        )
        pooled = mean_pool(out.hidden_states[self.config.extraction_layer], attention_mask)
        classifier = self.guidance_head(pooled)
        with torch.no_grad():  # as the reference: the guided logits are for prediction, not training
            logits = self.guide(out.logits, classifier)
        return CausalLMOutputWithPast(logits=logits, hidden_states=out.hidden_states)

    def _classifier_logits(self, input_ids, attention_mask, labels):
        """The head's logit of each next answer token (B, T-1), from the base's last hidden states."""
        if labels is None:
            raise UnlearnError("T3: classifier_only needs labels")
        if self.config.extraction_layer != -1:
            raise UnlearnError("T3: training reads the last hidden states (extraction_layer -1), as the reference")
        with torch.no_grad():
            hidden = self.base_lm.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        pooled = mean_pool(hidden, attention_mask)
        targets = labels[:, 1:].masked_fill(labels[:, 1:] == IGNORE_INDEX, 0)
        return self.guidance_head.target_token_logits(pooled[:, :-1, :].contiguous(), targets)

    @torch.no_grad()
    def generate(self, inputs=None, **kwargs):
        """Greedy (or sampled, ``do_sample``) decoding with the guided logits, the base model's
        key/value cache and running sums of the hidden states (the reference's cached generation).
        Takes ``max_new_tokens`` or ``max_length``, ``attention_mask``, ``eos_token_id``,
        ``pad_token_id``, ``stopping_criteria``, ``do_sample``, ``temperature``."""
        config = self.generation_config
        input_ids = inputs if inputs is not None else kwargs.pop("input_ids")

        def take(name, default=None):
            value = kwargs.pop(name, None)
            return value if value is not None else getattr(config, name, default)

        attention_mask = kwargs.pop("attention_mask", None)
        attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.device)
        max_new = kwargs.pop("max_new_tokens", None)
        max_length = kwargs.pop("max_length", None)
        if max_new is None:
            if max_length is None:
                raise UnlearnError("T3 generation needs max_new_tokens or max_length")
            max_new = int(max_length) - input_ids.shape[1]
        do_sample = bool(take("do_sample", False))
        temperature = take("temperature", 1.0) if do_sample else None
        eos = take("eos_token_id")
        eos = (
            None
            if eos is None
            else torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=input_ids.device).flatten()
        )
        pad = take("pad_token_id")
        pad = int(pad if pad is not None else (eos[0] if eos is not None else 0))
        stopping = kwargs.pop("stopping_criteria", None)
        if int(kwargs.pop("num_beams", None) or 1) != 1 or kwargs.pop("top_p", None) not in (None, 1.0):
            raise UnlearnError("T3 generation is greedy or sampled: no beam search or top-p (as the reference)")
        for name in ("use_cache", "top_k"):  # lm-eval passes them; the cache is always used
            kwargs.pop(name, None)
        if kwargs:
            raise UnlearnError(f"T3 generation does not take {', '.join(sorted(kwargs))}")

        import inspect

        cache_name = "cache" if "cache" in inspect.signature(self.base_lm.forward).parameters else "past_key_values"
        generated, full_mask = input_ids, attention_mask
        unfinished = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
        cache, current, current_mask, total, count = None, input_ids, attention_mask, None, None
        for _ in range(max(int(max_new), 0)):
            out = self.base_lm(
                input_ids=current,
                attention_mask=full_mask,
                output_hidden_states=True,
                use_cache=True,
                **{cache_name: cache},
            )
            hidden = out.hidden_states[self.config.extraction_layer]
            mask = current_mask.to(device=hidden.device, dtype=hidden.dtype)
            step_sum = (hidden * mask.unsqueeze(-1)).sum(dim=1)
            step_count = mask.sum(dim=1, keepdim=True)
            total = step_sum if total is None else total + step_sum
            count = step_count if count is None else count + step_count
            classifier = self.guidance_head((total / count.clamp_min(1)).unsqueeze(1))
            logits = self.guide(out.logits[:, -1:, :], classifier).squeeze(1)
            if do_sample:
                tokens = torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1).squeeze(-1)
            else:
                tokens = torch.argmax(logits, dim=-1)
            tokens = torch.where(unfinished.bool(), tokens, torch.full_like(tokens, pad))
            step_mask = unfinished.to(full_mask.dtype)
            generated = torch.cat([generated, tokens[:, None]], dim=-1)
            full_mask = torch.cat([full_mask, step_mask[:, None]], dim=-1)
            cache = getattr(out, "cache", None) or out.past_key_values
            current, current_mask = tokens[:, None], step_mask[:, None]
            if eos is not None:
                unfinished = unfinished * (~torch.isin(tokens, eos)).long()
            done = False
            if stopping is not None:
                result = stopping(generated, logits)
                done = bool(result.all()) if torch.is_tensor(result) else bool(result)
            if unfinished.max() == 0 or done:
                break
        return generated


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM`` know ``unlearn_t3`` (idempotent)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(MODEL_TYPE, T3Config)
        AutoModelForCausalLM.register(T3Config, T3CausalLM)


register()

__all__ = ["GuidanceHead", "T3CausalLM", "T3Config", "mean_pool", "register", "MODEL_TYPE"]


def describe(model: Any) -> dict[str, Any]:
    """What run.json records of a T3 model's settings."""
    c = model.config
    return {
        "guidance": dict(c.guidance),
        "pooling": c.pooling,
        "extraction_layer": c.extraction_layer,
        "guidance_scale": c.guidance_scale,
        "base_temp": c.base_temp,
    }
