"""The request detail screen and the isolation progress screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from ..core.checks.detectors import first_divergence
from ..core.report import fmt
from .model import RequestView, RunModel
from .render import HIGHLIGHT_STYLE, answer_text

MAX_BOUNDARY_MARKS = 48


def prompt_text(model: RunModel, view: RequestView) -> Text:
    """The memo with its planted code highlighted and (estimated) block boundaries marked."""
    memo = model.memos.get(view.memo or "")
    if memo is None:
        return Text(view.prompt_tail or "(prompt not in the log)", style="grey70")
    text = memo.text
    out = Text()
    grid = memo.grid or 0
    marks: list[tuple[int, str]] = []
    if grid and memo.tokens:
        chars_per_token = len(text) / memo.tokens
        count = memo.tokens // grid
        step = max(1, -(-count // MAX_BOUNDARY_MARKS))
        for k in range(step, count + 1, step):
            at = round(k * grid * chars_per_token)
            space = text.find(" ", at)            # at a word break, so the marks never split a word
            marks.append((space if 0 <= space < at + 24 else at, f"┃{k * grid}"))
    position = 0
    for at, label in marks + [(len(text), "")]:
        at = min(at, len(text))
        if at < position:
            continue
        out.append(text[position:at])
        if label:
            out.append(label, style="bold magenta")
        position = at
    if memo.code:
        at = out.plain.find(memo.code)
        if at >= 0:
            out.stylize(HIGHLIGHT_STYLE["own"], at, at + len(memo.code))
    return out


def aligned(a_label: str, a: str, b_label: str, b: str) -> Text:
    """Two answers one above the other, the first differing character marked in both."""
    at = first_divergence(a, b)
    out = Text()
    if at is None:
        out.append(f"{a_label} and {b_label} are identical\n", style="green")
        out.append(a)
        return out
    out.append(f"first difference at character {at}\n", style="bold magenta")
    for label, s in ((a_label, a), (b_label, b)):
        line = Text(f"{label:>6}: ", style="bold")
        body = Text(s.replace("\n", "⏎"))
        if at < len(s):
            body.stylize(HIGHLIGHT_STYLE["divergence"], at, at + 1)
        line.append_text(body)
        out.append_text(line)
        out.append("\n")
    return out


def comparison(model: RunModel, view: RequestView) -> Text | None:
    for finding in view.findings:
        ev = finding.evidence
        other = ev.get("control_request") or ev.get("cold_request")
        if other and other in model.requests:
            label = "cold" if "cold_request" in ev else "control"
            return aligned("hit", view.text, label, model.requests[other].text)
    siblings = [r for r in model.requests.values() if r.memo == view.memo and r.task == view.task
                and r.request != view.request and r.finished and r.phase == view.phase]
    if view.task == "determinism" and siblings:
        return aligned(f"#{view.request}", view.text, f"#{siblings[0].request}", siblings[0].text)
    return None


class RequestDetail(Screen):
    BINDINGS = [Binding("escape,q", "app.pop_screen", "back"), Binding("i", "isolate", "isolate")]

    def __init__(self, model: RunModel, request: int) -> None:
        super().__init__()
        self.model = model
        self.request = request

    def compose(self) -> ComposeResult:
        view = self.model.requests[self.request]
        head = Text()
        head.append(f"request {view.request}", style="bold")
        fields = [("phase", view.phase), ("slot", view.slot), ("round", view.round), ("memo", view.memo),
                  ("task", view.task), ("arm", view.arm)]
        head.append("".join(f"  {name} {value}" for name, value in fields if value not in (None, "")))
        if view.code:
            head.append("  code ")
            head.append(view.code, style=HIGHLIGHT_STYLE["own"])
        head.append(f"\nprompt {fmt.cell(view.prompt_tokens)} tok, cached {fmt.cell(view.cached_tokens)}, ttft "
                    f"{'-' if view.ttft is None else f'{view.ttft * 1000:.0f} ms'}", style="grey70")
        if view.server_id:
            head.append(f"\nthe server's id {view.server_id} (its log names the request by it)", style="grey70")
        memo = self.model.memos.get(view.memo or "")
        if memo and memo.code_tokens and memo.code_tokens[0] is not None:
            head.append(f"\ncode at tokens {memo.code_tokens[0]}-{memo.code_tokens[1]} of {memo.tokens} "
                        f"({memo.sizing}); grid {memo.grid}: boundaries ┃ are placed by estimate", style="grey70")
        with VerticalScroll(id="detail"):
            yield Static(head, id="detail-head")
            for finding in view.findings:
                style = {"fail": "bold red", "warn": "yellow"}.get(finding.severity, "grey62")
                at = "-" if finding.offset is None else finding.offset
                yield Static(Text(f"{finding.severity.upper()} {finding.kind} @ {at}: {finding.detail}",
                                  style=style), classes="detail-finding")
            iso = self.model.isolations.get(view.request)
            if iso and iso.result:
                r = iso.result
                yield Static(Text(f"isolation: {r.verdict.upper()}: reproduced {r.reproduced}/{r.hit_runs} hits, "
                                  f"{r.cold_reproduced}/{r.cold_runs} cold; {r.detail}", style="bold"),
                             id="detail-isolation")
            yield Static(Text("answer", style="bold underline"))
            yield Static(answer_text(view, self.model.registry), id="detail-answer")
            compared = comparison(self.model, view)
            if compared is not None:
                yield Static(Text("divergence", style="bold underline"))
                yield Static(compared, id="detail-divergence")
            yield Static(Text("prompt (memo)", style="bold underline"))
            yield Static(prompt_text(self.model, view), id="detail-prompt")
            yield Static(Text(view.prompt_tail, style="grey70"), id="detail-question")
        yield Footer()

    def action_isolate(self) -> None:
        self.app.isolate_request(self.request)


class IsolationProgress(ModalScreen):
    """Progress of an isolation re-run, then its verdict with counts."""

    BINDINGS = [Binding("escape,q,enter", "dismiss_screen", "close")]

    def __init__(self, model: RunModel, request: int) -> None:
        super().__init__()
        self.model = model
        self.request = request

    def compose(self) -> ComposeResult:
        with Vertical(id="isolation-box"):
            yield Static(id="isolation-body")
            yield Static(Text("esc: close", style="grey62"), id="isolation-hint")

    def on_mount(self) -> None:
        self.refresh_view()
        self.set_interval(0.2, self.refresh_view)

    def refresh_view(self) -> None:
        iso = self.model.isolations.get(self.request)
        body = Text(f"isolation re-run of request {self.request}\n", style="bold")
        if iso is None:
            body.append("starting…")
        elif iso.result is None:
            done = iso.sent
            body.append(f"{iso.kind}: re-sending alone, {iso.k} as hits then {iso.k} cold: {done}/{2 * iso.k}\n")
            body.append("▮" * done + "▯" * (2 * iso.k - done), style="cyan")
        else:
            r = iso.result
            style = {"leak": "bold white on red", "hit_path_corruption": "bold white on red",
                     "fluke": "bold black on yellow"}.get(r.verdict, "bold")
            body.append(f" {(r.verdict or 'unknown').upper()} ", style=style)
            body.append(f"\nreproduced on {r.reproduced}/{r.hit_runs} hits alone, {r.cold_reproduced}/{r.cold_runs} "
                        f"cold\n{r.detail}")
        self.query_one("#isolation-body", Static).update(body)

    def action_dismiss_screen(self) -> None:
        self.dismiss()
