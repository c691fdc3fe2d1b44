"""hitproof's own examples for tui/embedded/recall_train.py (issue 33): memos from tui.core.evidence.text, codes from
CodeBook, the prompts the scenarios send (recall, recall after a longer suffix, conversation transcripts, the agent
replay's recall turns, summary and determinism questions), each as prompt and answer token ids. Like the trainer,
hitproof never imports this file (it needs a tokenizer from transformers)."""

from __future__ import annotations

import random

from tui.core.evidence import agent as agent_text
from tui.core.evidence.codes import CodeBook, new_nonce
from tui.core.evidence.text import (RECALL_ANSWER_LEAD, RECALL_QUESTION, MemoText, SentenceSource, code_sentence,
                                    determinism_suffix, recall_suffix, summary_suffix)

EOS = 0
TASKS = (("recall", 0.40), ("recall_suffix", 0.10), ("conversation", 0.15), ("agent", 0.10),
         ("summary", 0.15), ("determinism", 0.10))


# -- examples ----------------------------------------------------------------------------


class Examples:
    """One example: (prompt token ids, answer token ids, lm mask over the prompt)."""

    def __init__(self, tokenizer, seed: int):
        self.tok = tokenizer
        self.rng = random.Random(seed)
        self.codes = CodeBook(random.Random(seed + 1))
        self.issued = 0
        # ~tokens per filler sentence with this tokenizer, measured once
        sample = " ".join(SentenceSource("calibration").next() for _ in range(40))
        self.per_sentence = len(self.encode(sample)) / 40

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _code(self) -> str:
        # A CodeBook never reuses a 4-digit group (a run's codes), so it runs dry after ~2,500 codes:
        # a fresh book every 500, as every run starts one.
        self.issued += 1
        if self.issued % 500 == 0:
            self.codes = CodeBook(random.Random(self.rng.random()))
        return self.codes.new_code()

    def memo(self, tokens: int, code: str | None) -> MemoText:
        r = self.rng
        memo_id = f"m{r.randrange(100):02d}" + r.choice(["", "-shared", "-rot", "-long", "-ctl", "-det"])
        m = MemoText(memo_id=memo_id, nonce=new_nonce(), code=code)
        source = SentenceSource(f"{r.random()}")
        n = max(1, round(tokens / self.per_sentence))
        m.sentences = [source.next() for _ in range(n)]
        if code is not None:
            position = r.uniform(0.1, 0.9)
            m.code_index = max(1, min(n - 1, round(n * position)))
            m.sentences.insert(m.code_index, code_sentence(code))
        return m

    def filler(self, tokens: int) -> str:
        source = SentenceSource(f"{self.rng.random()}")
        return " ".join(source.next() for _ in range(max(1, round(tokens / self.per_sentence))))

    @staticmethod
    def _section_sentence(m: MemoText, section: int) -> str:
        i = (section - 1) * m.sentences_per_section
        return m.sentences[i] if i < len(m.sentences) else m.sentences[0]

    def make(self, task: str, tokens: int) -> tuple[str, str]:
        """(prompt text, answer text) of about `tokens` prompt tokens."""
        r = self.rng
        code = self._code()
        if task in ("recall", "recall_suffix"):
            m = self.memo(tokens, code)
            extra = "\n\n" + self.filler(r.randint(20, 300)) if task == "recall_suffix" else ""
            return m.render() + extra + recall_suffix(), f" {code}."
        if task == "bare":           # the code, filler, the question: the copy alone, no memo around it
            return code_sentence(code) + " " + self.filler(tokens) + recall_suffix(), f" {code}."
        if task == "summary":
            m = self.memo(tokens, code)
            return m.render() + summary_suffix(), " " + self._section_sentence(m, 3)
        if task == "determinism":
            m = self.memo(tokens, code)
            return m.render() + determinism_suffix(), " " + self._section_sentence(m, 1)
        if task == "conversation":   # tui/core/soak/phases/conversation.py's transcript
            turns = r.randint(1, 6)
            turn_tokens = max(40, min(r.randint(60, 500), int(tokens * 0.6 / turns)))
            m = self.memo(max(64, tokens - turns * turn_tokens), code)
            transcript = f"{m.render()}\n"
            for t in range(1, turns + 1):
                note = self.filler(turn_tokens)
                team = next((w for w in note.split() if w in ("audit", "logistics", "treasury", "procurement",
                                                              "payroll", "facilities", "compliance", "inventory",
                                                              "billing", "vendor", "customs", "archive", "field",
                                                              "tax")), "audit")
                transcript += f"\nUser: Note {t}: {note} Which team does note {t} mention first?\nAssistant:"
                transcript += f" The {team} team."
            transcript += f"\nUser: {RECALL_QUESTION}\nAssistant: {RECALL_ANSWER_LEAD}"
            return transcript, f" {code}."
        if task == "agent":          # tui/core/evidence/agent.py's generator, a recall turn
            # tool schemas cost ~150 tokens each with this tokenizer: as many as the length allows
            tools = r.randint(1, max(1, min(25, tokens // 400)))
            growth = max(40, min(r.randint(60, 400), tokens // 4))
            turns = max(3, min(12, round((tokens - 150 * tools) / growth)))
            conv = agent_text.generate(tools=tools, turns=turns, growth_tokens=growth,
                                       integrity_every=r.randint(2, 4), code=code, seed=f"{r.random()}",
                                       nonce=new_nonce(), max_tokens=16, recall_max_tokens=20,
                                       tokens_per_sentence=self.per_sentence)
            recalls = [t for t in conv.turns if t.task == "recall"]
            return r.choice(recalls).prompt, f" {code}."
        raise ValueError(task)

    def tokens(self, task: str, tokens: int) -> tuple[list[int], list[int]]:
        prompt, answer = self.make(task, tokens)
        return self.encode(prompt), self.encode(answer) + [EOS]


def pick_task(rng: random.Random, bare_share: float = 0.0) -> str:
    if rng.random() < bare_share:
        return "bare"
    x, acc = rng.random(), 0.0
    for task, share in TASKS:
        acc += share
        if x < acc:
            return task
    return TASKS[0][0]
