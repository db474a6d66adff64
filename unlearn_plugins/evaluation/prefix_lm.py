"""An lm-eval model class that scores each prompt once and stops each generation when it is done.

TOFU asks many continuations of the same prompt: the truth ratio scores the paraphrased answer
and five perturbed ones after a question, the probability task the answer after it again, the
extraction strength every suffix of the answer, and Model Utility the same retain questions
through several tasks. lm-eval's HFLM runs every request as a whole sequence (prompt included,
logits over the whole vocabulary at every position). :class:`PrefixSharedLM` (registered with
lm-eval as ``hf-prefix``) answers the same requests with the same numbers while doing only the
work they need:

* requests are keyed by their token sequence: identical requests (across tasks too) and a
  sequence that is a prefix of another one scored after the same prompt are computed once;
* the prompt's key/value cache is computed once and every continuation after it is run from
  that cache, batched (continuations of several prompts share a batch through an attention mask);
* greedy generation drops each sequence from the batch when it reaches its end token or a stop
  string, instead of running the batch until its longest answer ends, and never passes the cap.

With fp32 weights the numbers equal HFLM's to rounding (tests/test_prefix_lm.py; bench/eval_protocol.py
on SmolLM2); ``scoring="hf"`` in :func:`..lm_eval_runner.evaluate_model` keeps HFLM itself.
Importing this module registers the class with lm-eval (``@register_model``): then
``lm_eval.simple_evaluate(model="hf-prefix", ...)`` reaches it, and ``unlearn-lm-eval --model
hf-prefix ...`` is lm-eval's CLI after that import (:mod:`.lm_eval_cli`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

#: the name lm-eval knows this class by (``--model hf-prefix``)
MODEL_NAME = "hf-prefix"


@dataclass
class _Group:
    """The token suffixes scored after one cached stem: suffix r's tokens but its last are the
    inputs (the first is the stem's last token), its tokens but its first the targets."""

    stem: tuple[int, ...]
    suffixes: list[tuple[int, ...]] = field(default_factory=list)


@dataclass
class _Plan:
    """Where each request's numbers are read: (group, suffix, first position, end position)."""

    groups: list[_Group]
    where: list[tuple[int, int, int, int]]


def plan(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> _Plan:
    """Group (context tokens, continuation tokens) pairs by the stem their scoring can start from.

    A sequence (context + continuation) is scored from the shortest context any request gives it;
    the tokens before that context's last one form its stem (cached once), the rest its suffix. A
    suffix that is a prefix of another suffix of the same stem is read from the longer one (causal:
    the same positions give the same outputs)."""
    first: dict[tuple[int, ...], int] = {}
    for ctx, cont in pairs:
        full = tuple(ctx) + tuple(cont)
        first[full] = min(first.get(full, len(ctx)), len(ctx))
    by_stem: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for full, start in first.items():
        by_stem.setdefault(full[: start - 1], set()).add(full[start - 1 :])
    groups: list[_Group] = []
    home: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]] = {}
    for stem, suffixes in by_stem.items():
        kept: list[tuple[int, ...]] = []
        for suffix in sorted(suffixes, key=lambda s: (-len(s), s)):
            at = next((k for k, longer in enumerate(kept) if longer[: len(suffix)] == suffix), None)
            if at is None:
                kept.append(suffix)
                at = len(kept) - 1
            home[(stem, suffix)] = (len(groups), at)
        groups.append(_Group(stem, kept))
    where = []
    for ctx, cont in pairs:
        full = tuple(ctx) + tuple(cont)
        start = first[full]
        g, r = home[(full[: start - 1], full[start - 1 :])]
        offset = len(ctx) - start  # input position that predicts the continuation's first token
        where.append((g, r, offset, offset + len(cont)))
    return _Plan(groups, where)


def check_options(options: dict[str, Any]) -> None:
    """The user's options of ``--model hf-prefix`` (``--model_args`` with ``--batch_size`` and
    ``--device``) that HFLM would take without a word or fail on with a traceback: one
    :class:`..errors.UnlearnError` line each, before any model is loaded. ``peft`` (a LoRA
    adapter) must have been trained on ``pretrained``'s weights (as ``unlearn eval --adapter``),
    unless ``allow_other_base=True``."""
    from pathlib import Path

    from ..errors import UnlearnError
    from ..models import WEIGHT_FILE, ModelError, check_adapter

    batch = options.get("batch_size", 1)
    text = str(batch).strip()
    if not (
        (text.isdigit() and int(text) >= 1)
        or text == "auto"
        or (text.startswith("auto:") and text[5:].isdigit() and int(text[5:]) >= 1)
    ) or isinstance(batch, bool):
        raise UnlearnError(f"--batch_size {batch}: must be an integer >= 1, 'auto' or 'auto:N' (N >= 1)")
    dtype = options.get("dtype")
    if isinstance(dtype, str) and dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise UnlearnError(f"--model_args dtype={dtype}: not a torch dtype; give auto, float32, bfloat16 or float16")
    device = options.get("device")
    if isinstance(device, str) and device.startswith("cuda") and not torch.cuda.is_available():
        raise UnlearnError(f"--device {device}: this machine has no CUDA device (give --device cpu)")
    pretrained = options.get("pretrained")
    if isinstance(pretrained, str):
        folder = Path(pretrained).expanduser()
        if folder.is_file():
            raise UnlearnError(f"--model_args pretrained={pretrained}: a file, not a model folder")
        if folder.is_dir():
            named = [p.name for p in folder.iterdir()]
            weights = any(WEIGHT_FILE.match(n) or n.endswith(".index.json") or n.endswith(".gguf") for n in named)
            if "config.json" not in named or not (weights or options.get("gguf_file")):
                missing = "config.json" if "config.json" not in named else "model weights (model.safetensors, ...)"
                raise UnlearnError(f"--model_args pretrained={pretrained}: no {missing} in the folder")
        elif pretrained.startswith((".", "/", "~")) or pretrained.count("/") > 1:
            raise UnlearnError(f"--model_args pretrained={pretrained}: no such folder")
    peft = options.get("peft")
    if isinstance(peft, str) and isinstance(pretrained, str):
        allow = str(options.get("allow_other_base", False)).lower() in ("true", "1", "yes")
        try:
            check_adapter(peft, spec=pretrained, where=str(Path(pretrained).expanduser()), allow_other_base=allow)
        except ModelError as exc:
            raise UnlearnError(
                str(exc)
                .replace("--adapter ", "--model_args peft=")
                .replace("pass --allow-other-base", "add allow_other_base=True to --model_args")
                .replace("--model ", "pretrained=")
            ) from None


@register_model(MODEL_NAME)
class PrefixSharedLM(HFLM):
    """HFLM with prompt-shared log-likelihood scoring and compacting greedy generation (module doc)."""

    #: draft tokens a greedy decoding step checks at most (lookup drafting, :meth:`_decode`); 0: none.
    #: Off by default: on one CPU thread (SmolLM2, a reglu_tofu cell's retain and forget generations)
    #: 4 draft tokens had 175 of 508 accepted and the generation took 15% more CPU time (a step's
    #: cost grows with its width there); where a decoding step is memory-bound (a GPU) it may pay.
    #: ``--model_args draft_tokens=4`` (lm-eval) or ``PrefixSharedLM.draft_tokens = 4`` turns it on.
    draft_tokens = 0

    def __init__(self, *args, draft_tokens: int | None = None, allow_other_base: bool = False, **kwargs):
        from ..errors import UnlearnError

        given = {**({"pretrained": args[0]} if args else {}), **kwargs}
        check_options({**given, "allow_other_base": allow_other_base})
        try:
            super().__init__(*args, **kwargs)
        except TypeError as exc:  # an option neither HFLM nor the model's from_pretrained takes
            if "unexpected keyword argument" not in str(exc):
                raise
            raise UnlearnError(
                f"--model_args: {' '.join(str(exc).split())}: not an option of {MODEL_NAME} (HFLM's options, "
                "draft_tokens, allow_other_base, or the model's from_pretrained keywords)"
            ) from None
        if draft_tokens is not None:
            self.draft_tokens = int(draft_tokens)

    # ------------------------------------------------------------------ log-likelihood

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        if self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        window = self.max_length + 1
        answers: list[Any] = [None] * len(requests)
        fits = [i for i, (_, ctx, cont) in enumerate(requests) if len(ctx) + len(cont) <= window]
        longer = [i for i in range(len(requests)) if len(requests[i][1]) + len(requests[i][2]) > window]
        if longer:  # truncated from the left as HFLM does: its own path
            done = super()._loglikelihood_tokens([requests[i] for i in longer], disable_tqdm=True)
            for i, answer in zip(longer, done):
                answers[i] = answer
        if fits:
            scored = plan([(requests[i][1], requests[i][2]) for i in fits])
            per_row = self._score_rows(scored.groups)
            for i, (g, r, a, b) in zip(fits, scored.where):
                logprobs, greedy = per_row[g][r]
                answers[i] = (float(logprobs[a:b].sum()), bool(greedy[a:b].all()))
        for (request_str, _, _), answer in zip(requests, answers):
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
        return answers

    def _row_budget(self) -> int:
        size = self.batch_size if isinstance(self.batch_size, int) else 0
        return max(1, size or 8)

    def _score_rows(self, groups: list[_Group]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Per group and suffix: (log-probability of each target token, whether it is the argmax),
        in batches of about ``batch_size`` suffixes (longest first, so padding stays small)."""
        out: list[list[Any]] = [[None] * len(g.suffixes) for g in groups]
        order = sorted(range(len(groups)), key=lambda g: (-len(groups[g].stem) - len(groups[g].suffixes[0]), g))
        budget = self._row_budget()
        batch: list[int] = []
        rows = 0
        for g in order:
            if batch and rows + len(groups[g].suffixes) > budget:
                self._score_batch(groups, batch, out)
                batch, rows = [], 0
            batch.append(g)
            rows += len(groups[g].suffixes)
        if batch:
            self._score_batch(groups, batch, out)
        return out

    def _cache_name(self) -> str:
        """The forward keyword of the key/value cache: ``cache`` (transformers 5) or ``past_key_values``."""
        import inspect

        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _forward(self, **kwargs):
        with (
            torch.no_grad(),
            torch.autocast(
                device_type=self.device.type,
                dtype=self.mixed_precision_dtype,
                enabled=self.mixed_precision_dtype is not None,
            ),
        ):
            return self.model(**kwargs)

    def _score_batch(self, groups: list[_Group], batch: list[int], out: list[list[Any]]) -> None:
        """One forward over the batch's stems (their key/value cache), one over their suffixes."""
        device = self.device
        pad = self.tokenizer.pad_token_id or 0
        stems = [groups[g].stem for g in batch]
        width = max(len(s) for s in stems)
        member = [k for k, g in enumerate(batch) for _ in groups[g].suffixes]
        suffixes = [s for g in batch for s in groups[g].suffixes]
        length = max(len(s) for s in suffixes) - 1
        ids = torch.tensor([list(s[:-1]) + [pad] * (length + 1 - len(s)) for s in suffixes], device=device)
        targets = torch.tensor([list(s[1:]) + [pad] * (length + 1 - len(s)) for s in suffixes], device=device)
        stem_lens = torch.tensor([len(s) for s in stems], device=device)
        index = torch.tensor(member, dtype=torch.long, device=device)
        positions = stem_lens.index_select(0, index)[:, None] + torch.arange(length, device=device)[None, :]
        kwargs: dict[str, Any] = {"input_ids": ids, "position_ids": positions}
        if width:
            stem_ids = torch.tensor([list(s) + [pad] * (width - len(s)) for s in stems], device=device)
            stem_mask = (torch.arange(width, device=device)[None, :] < stem_lens[:, None]).long()
            stem_pos = torch.arange(width, device=device)[None, :].expand(len(stems), -1)
            keep = {"logits_to_keep": 1} if self._forward_accepts("logits_to_keep") else {}  # no stem logits
            stem_out = self._forward(
                input_ids=stem_ids, attention_mask=stem_mask, position_ids=stem_pos, use_cache=True, **keep
            )
            cache = getattr(stem_out, "cache", None) or stem_out.past_key_values
            cache.reorder_cache(index)
            mask = torch.cat([stem_mask.index_select(0, index), torch.ones_like(ids)], dim=1)
            kwargs.update({self._cache_name(): cache, "attention_mask": mask, "use_cache": True})
        logits = self._forward(**kwargs).logits
        # log_softmax at the targets only, without a second vocabulary-sized tensor: logit - logsumexp
        # in the softmax dtype (fp32), as HFLM's log_softmax(dtype=softmax_dtype)
        dtype = self.softmax_dtype or logits.dtype
        target_lp = logits.gather(2, targets.unsqueeze(-1)).squeeze(-1).to(dtype) - torch.logsumexp(
            logits.to(dtype), dim=-1
        )
        predicted = logits.argmax(dim=-1)
        greedy = predicted == targets
        del logits
        predicted = predicted.cpu().tolist()
        for row, (k, s) in enumerate(zip(member, suffixes)):
            g = batch[k]
            r = groups[g].suffixes.index(s)
            n = len(s) - 1
            out[g][r] = (target_lp[row, :n].cpu(), greedy[row, :n].cpu())
            self._drafts().setdefault(groups[g].stem, []).append((s, predicted[row][:n]))

    # ------------------------------------------------------------------ generation

    def _forward_accepts(self, name: str) -> bool:
        import inspect

        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return name in inspect.signature(model.forward).parameters

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        """Greedy generation whose finished sequences leave the batch (lm-eval's HFLM runs
        ``model.generate`` until the last sequence of the batch stops); anything else (sampling,
        beams, other options) is HFLM's own. The tokens returned are those ``generate`` would
        give for the text lm-eval keeps: each row padded after its end token, or after the
        token that completes a stop string (lm-eval cuts the text there)."""
        options = dict(generation_kwargs)
        mask = options.pop("attention_mask", None)
        do_sample = options.pop("do_sample", None)
        temperature = options.pop("temperature", 0.0)
        greedy = do_sample is False or (do_sample is None and not temperature)
        if not greedy or options or self.backend != "causal":
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        return self._greedy(context, mask, max_length, stop)

    def _end_ids(self) -> set[int]:
        """The ids ``generate`` stops a sequence at: the model's generation config's end tokens."""
        config = getattr(self.model, "generation_config", None)
        ids = getattr(config, "eos_token_id", None)
        if ids is None:
            return set()
        return {int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])}

    @property
    def counts(self) -> dict[str, int]:
        """Generated tokens read from scored sequences (``drafted_tokens``) and decoded one step at
        a time (``decoded_tokens``): how much of the generation the scoring saved."""
        if not hasattr(self, "_counts"):
            self._counts: dict[str, int] = {}
        return self._counts

    def _drafts(self) -> dict[tuple[int, ...], list[tuple[tuple[int, ...], list[int]]]]:
        """Per stem, the sequences scored after it and the greedy prediction at each of their
        positions (teacher-forced): a greedy generation from a prompt inside such a sequence follows
        it for as long as the prediction equals its next token, so those tokens need no decoding."""
        if not hasattr(self, "_draft_table"):
            self._draft_table: dict[tuple[int, ...], list[tuple[tuple[int, ...], list[int]]]] = {}
        return self._draft_table

    def _drafted(self, prompt: list[int], steps: int) -> list[int]:
        """The first greedy tokens after ``prompt`` known from scored sequences: the predictions
        along the longest agreement with one of them, up to and including the first token where
        the prediction leaves it (or ``steps`` tokens)."""
        table = self._drafts()
        if not table:
            return []
        best: list[int] = []
        key = tuple(prompt)
        for length in {len(stem) for stem in table}:
            if length >= len(key):
                continue
            for suffix, predicted in table.get(key[:length], ()):
                j = len(key) - length  # prompt tokens inside the suffix
                if j > len(predicted) or suffix[:j] != key[length:]:
                    continue
                tokens = []
                for i in range(j - 1, len(predicted)):
                    tokens.append(predicted[i])
                    if len(tokens) >= steps or predicted[i] != suffix[i + 1]:
                        break
                if len(tokens) > len(best):
                    best = tokens
        return best[:steps]

    def _finished_at(self, tokens: list[int], end_ids: set[int], stop: list[str]) -> int | None:
        """Index of the token at which a greedy sequence stops: an end token, or the token that
        completes a stop string in the text lm-eval keeps (None: it goes on)."""
        for i, token in enumerate(tokens):
            if token in end_ids:
                return i
            if stop and self._completes_stop(tokens[: i + 1], stop):
                return i
        return None

    def _completes_stop(self, tokens: list[int], stop: list[str]) -> bool:
        """Whether the text of ``tokens`` (a sequence checked after each of its tokens) holds a
        stop string. A stop string the last token completes lies in the text of the last few
        tokens (each token of an ASCII string adds at least one character), so only that tail is
        decoded, as lm-eval's own stop criterion does; a hit there is confirmed on the whole text,
        and a stop string that is not ASCII is looked for in the whole text."""
        if any(not s.isascii() for s in stop):
            return any(s in self.tok_decode(tokens) for s in stop)
        window = 2 * max(len(s) for s in stop) + 4
        if not any(s in self.tok_decode(tokens[-window:]) for s in stop):
            return False
        return any(s in self.tok_decode(tokens) for s in stop)

    def _greedy(self, context: torch.Tensor, mask: torch.Tensor | None, max_length: int, stop: list[str]):
        device = context.device
        rows, width = context.shape
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        mask = torch.ones_like(context) if mask is None else mask.to(device).long()
        out = torch.full((rows, max(max_length, width)), pad, dtype=context.dtype, device=device)
        out[:, :width] = context
        steps = max_length - width
        if steps <= 0:
            return out[:, :width]
        end_ids = self._end_ids()
        prompts = [context[r][mask[r].bool()].tolist() for r in range(rows)]
        todo: list[int] = []
        known: list[list[int]] = []
        for r, prompt in enumerate(prompts):
            tokens = self._drafted(prompt, steps)
            stop_at = self._finished_at(tokens, end_ids, stop)
            if stop_at is not None:
                tokens = tokens[: stop_at + 1]
            out[r, width : width + len(tokens)] = torch.tensor(tokens, dtype=context.dtype, device=device)
            self.counts["drafted_tokens"] = self.counts.get("drafted_tokens", 0) + len(tokens)
            known.append(tokens)
            if stop_at is None and len(tokens) < steps:
                todo.append(r)
        if todo:
            generated = self._decode(
                [prompts[r] + known[r] for r in todo],
                [known[r] for r in todo],
                steps,
                end_ids,
                stop,
                references=[self._references(prompts[r]) for r in todo],
            )
            self.counts["decoded_tokens"] = self.counts.get("decoded_tokens", 0) + sum(map(len, generated))
            for r, tokens in zip(todo, generated):
                start = width + len(known[r])
                out[r, start : start + len(tokens)] = torch.tensor(tokens, dtype=context.dtype, device=device)
        return out[:, :max_length]

    def _references(self, prompt: list[int]) -> list[list[int]]:
        """Token sequences a generation after ``prompt`` may copy from: the prompt itself and the
        sequences scored after it (the answer, its paraphrase, the perturbed answers)."""
        key = tuple(prompt)
        found = [list(prompt)]
        for length in {len(stem) for stem in self._drafts()}:
            if length >= len(key):
                continue
            for suffix, _ in self._drafts().get(key[:length], ()):
                j = len(key) - length
                if suffix[:j] == key[length:]:
                    found.append(list(suffix[j:]))
        return found

    def _decode(
        self,
        contexts: list[list[int]],
        known: list[list[int]],
        steps: int,
        end_ids: set[int],
        stop: list[str],
        references: list[list[list[int]]] | None = None,
    ) -> list[list[int]]:
        """Greedy tokens after each context (left-padded into one batch) until an end token, a stop
        string (in the text of ``known`` + the new tokens) or ``steps`` generated tokens in all;
        finished sequences leave the batch.

        With ``references`` (per row, token sequences its text may copy: the prompt, the scored
        answers) a step also checks up to :attr:`draft_tokens` tokens that follow, in one of them,
        the row's last tokens (lookup drafting): one forward gives the greedy token after each, so
        every leading draft token equal to the model's own greedy choice is kept at once and the
        first one that differs is replaced by that choice (the greedy text is unchanged; a rejected
        draft token's key/value entry stays in the cache, masked out)."""
        device = self.device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], dtype=torch.long, device=device)
        budgets = [steps - len(k) for k in known]
        cache_name = self._cache_name()
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        extra = {"logits_to_keep": 1} if self._forward_accepts("logits_to_keep") else {}
        result = self._forward(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
        cache = getattr(result, "cache", None) or result.past_key_values
        fresh: list[list[int]] = [[t] for t in result.logits[:, -1, :].float().argmax(-1).tolist()]
        active = list(range(len(contexts)))
        next_pos = positions[:, -1] + 1
        generated: list[list[int]] = [[] for _ in contexts]
        lookups = [_NgramLookup(refs) for refs in references] if references and self.draft_tokens > 0 else None
        while True:
            keep: list[int] = []
            for k, row in enumerate(active):
                done = False
                for token in fresh[k]:
                    generated[row].append(token)
                    done = token in end_ids or len(generated[row]) >= budgets[row]
                    if not done and stop:
                        done = self._completes_stop(known[row] + generated[row], stop)
                    if done:
                        break
                if not done:
                    keep.append(k)
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(index) if hasattr(cache, "batch_select_indices") else cache.reorder_cache(
                    index
                )
                active, mask, next_pos = [active[k] for k in keep], mask[index], next_pos[index]
            drafts = [[] for _ in active]
            if lookups is not None:
                for k, row in enumerate(active):
                    room = budgets[row] - len(generated[row]) - 1
                    if room > 0:
                        drafts[k] = lookups[row].draft(contexts[row] + generated[row], min(room, self.draft_tokens))
            width = max(len(d) for d in drafts)
            if width and sum(map(len, drafts)) < len(active):  # too few to pay for a wider step
                drafts, width = [[] for _ in active], 0
            inputs = [[generated[row][-1]] + d + [pad] * (width - len(d)) for row, d in zip(active, drafts)]
            new_mask = [[1] * (1 + len(d)) + [0] * (width - len(d)) for d in drafts]
            mask = torch.cat([mask, torch.tensor(new_mask, dtype=mask.dtype, device=device)], dim=1)
            result = self._forward(
                input_ids=torch.tensor(inputs, dtype=torch.long, device=device),
                attention_mask=mask,
                position_ids=next_pos[:, None] + torch.arange(width + 1, device=device)[None, :],
                use_cache=True,
                **{cache_name: cache},
            )
            cache = getattr(result, "cache", None) or result.past_key_values
            predicted = result.logits.float().argmax(-1).tolist()
            fresh = []
            for k, d in enumerate(drafts):
                accepted = 0
                while accepted < len(d) and d[accepted] == predicted[k][accepted]:
                    accepted += 1
                fresh.append(predicted[k][: accepted + 1])
                if accepted < width:  # rejected draft tokens (and padding) are masked out
                    mask[k, mask.shape[1] - width + accepted :] = 0
                next_pos[k] += accepted + 1
                if d:
                    self.counts["draft_checked_tokens"] = self.counts.get("draft_checked_tokens", 0) + len(d)
                    self.counts["draft_accepted_tokens"] = self.counts.get("draft_accepted_tokens", 0) + accepted
            if width:
                self.counts["draft_steps"] = self.counts.get("draft_steps", 0) + 1
        return generated


class _NgramLookup:
    """Where the last tokens of a sequence occur in reference token sequences, and what follows
    them there (the longest match of 3, then 2 tokens; the first occurrence)."""

    SIZES = (3, 2)

    def __init__(self, references: list[list[int]]):
        self.follow: dict[tuple[int, ...], tuple[int, int]] = {}
        self.references = references
        for r, ref in enumerate(references):
            for n in self.SIZES:
                for i in range(len(ref) - n):
                    self.follow.setdefault(tuple(ref[i : i + n]), (r, i + n))

    def draft(self, sequence: list[int], limit: int) -> list[int]:
        for n in self.SIZES:
            if len(sequence) >= n and (hit := self.follow.get(tuple(sequence[-n:]))) is not None:
                r, at = hit
                return self.references[r][at : at + limit]
        return []
