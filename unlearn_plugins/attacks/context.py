"""What the host gives an attack (:class:`unlearn_plugins.interfaces.AttackContext`): the model to
attack, loaded on demand with its adapter merged in, the forget data when the attack needs it,
and the folder to save the attacked model to."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UnlearnError
from ..interfaces import QASample


@dataclass
class Context:
    """``forget``: the ``--forget`` spec (tofu:SPLIT, a JSON-lines file), read on first use.
    ``dtype``: the dtype the model is loaded and saved in (float32 unless asked: the attacked
    weights are then stored exactly)."""

    model: str
    out: Path
    adapter: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    trust_remote_code: bool = False
    allow_other_base: bool = False
    forget: str | None = None
    tofu_dir: str | None = None
    label: str = "attack"  # how errors name the attack
    saved: bool = False
    _samples: list[QASample] | None = field(default=None, repr=False)
    _merged: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def load_model(self) -> tuple[Any, Any]:
        from ..models import load_model_of

        model, tokenizer = load_model_of(self)
        if self.adapter:
            model = model.merge_and_unload()
        model.eval()
        return model, tokenizer

    def model_dir(self) -> str:
        from ..models import resolve_model

        if not self.adapter:
            return resolve_model(self.model)
        if self._merged is None:
            self._merged = tempfile.TemporaryDirectory(prefix="attack-merged-")
            model, tokenizer = self.load_model()
            model.save_pretrained(self._merged.name)
            tokenizer.save_pretrained(self._merged.name)
            del model
        return self._merged.name

    def forget_samples(self) -> list[QASample]:
        from ..data.qa import load_split

        if self.forget is None:
            raise UnlearnError(
                f"{self.label} needs the forget set: give --forget tofu:SPLIT or a JSON-lines file in TOFU's format"
            )
        if self._samples is None:
            self._samples = load_split(self.forget, self.tofu_dir)
        return self._samples

    def save_model(self, model: Any, tokenizer: Any) -> None:
        import torch

        bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise UnlearnError(f"{self.label}: the attacked model has NaN/inf weights ({bad[0]}, ...)")
        self.out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(self.out))
        tokenizer.save_pretrained(str(self.out))
        self.saved = True

    def adopt_folder(self, folder: str | Path) -> None:
        """Move a saved model folder (e.g. ``unlearn finetune``'s ``merged/``) in as the result."""
        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise UnlearnError(f"{self.label}: {folder} holds no model (config.json)")
        self.out.mkdir(parents=True, exist_ok=True)
        for item in folder.iterdir():
            shutil.move(str(item), str(self.out / item.name))
        self.saved = True

    def close(self) -> None:
        if self._merged is not None:
            self._merged.cleanup()
            self._merged = None
