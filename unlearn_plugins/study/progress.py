"""Per-cell progress of a study on stderr: one line when a cell starts, waits for another
process, finishes or fails; on a terminal also a progress bar for the whole study and one
per running cell (its stages). A cell's own output (training and evaluation bars, library
warnings) goes to its log file, named in the failure line."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, *, stream=None):
        self.stream = stream or sys.stderr
        self.total = total
        self.count = 0
        self.started: dict[str, float] = {}
        self.bars: dict[str, object] = {}
        self.positions: dict[str, int] = {}
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.overall = None
        if self.tty:
            from tqdm.auto import tqdm

            self.overall = tqdm(
                total=total, desc="cells", unit="cell", file=self.stream, position=0, dynamic_ncols=True
            )

    def line(self, text: str) -> None:
        if self.overall is not None:
            self.overall.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _head(self, word: str) -> str:
        width = len(str(self.total))
        return f"[{self.count:>{width}}/{self.total}] {word:<7}"

    def _finish(self) -> None:
        self.count += 1
        if self.overall is not None:
            self.overall.update(1)

    def cached(self, cell_id: str) -> None:
        self._finish()
        self.line(f"{self._head('cached')} {cell_id}")

    def start(self, cell_id: str, where: str) -> None:
        self.started[cell_id] = time.perf_counter()
        self.line(f"{' ' * (len(str(self.total)) * 2 + 3)} {'start':<7} {cell_id} on {where}")

    def stage(self, cell_id: str, index: int, total: int, label: str) -> None:
        self.started.setdefault(cell_id, time.perf_counter())
        if not self.tty:
            return
        from tqdm.auto import tqdm

        bar = self.bars.get(cell_id)
        if bar is None:
            used = set(self.positions.values())
            position = next(i for i in range(1, len(used) + 2) if i not in used)
            self.positions[cell_id] = position
            bar = self.bars[cell_id] = tqdm(
                total=total,
                desc=cell_id,
                unit="stage",
                file=self.stream,
                position=position,
                leave=False,
                dynamic_ncols=True,
            )
        bar.n = index
        bar.set_postfix_str(label[:60])

    def waiting(self, cell_id: str, message: str) -> None:
        self.line(f"{' ' * (len(str(self.total)) * 2 + 3)} {'wait':<7} {cell_id}: {message}")

    def finished(self, cell_id: str, result: dict) -> None:
        self._finish()
        bar = self.bars.pop(cell_id, None)
        self.positions.pop(cell_id, None)
        if bar is not None:
            bar.close()
        seconds = result.get("seconds")
        took = f" in {seconds:.0f} s" if isinstance(seconds, (int, float)) else ""
        if result["status"] == "done":
            self.line(f"{self._head('done')} {cell_id}{took} ({result.get('source', 'built')})")
        else:
            log = f" (log: {result['log']})" if result.get("log") else ""
            self.line(f"{self._head('FAILED')} {cell_id}: {result['error']}{log}")

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        if self.overall is not None:
            self.overall.close()
