"""prefix_text: the beginning of a prompt that the server tokenizes into exactly N tokens (a hit's twin writer), read
from /tokenize answers as bytes (post_for_bytes); a server whose answer is not token ids gives no prefix."""

from __future__ import annotations

import asyncio

import orjson

from tui.core.config.errors import ServerProblem
from tui.core.server.prefix import prefix_text


class WordServer:
    """A /tokenize that gives a BOS and one id per word (with the space before it) or punctuation mark."""

    def __init__(self, answer=None, status: int = 200, fail: bool = False):
        self.answer, self.status, self.fail, self.calls = answer, status, fail, 0

    async def post_for_bytes(self, path: str, body: dict, timeout: float = 60.0) -> tuple[int, bytes]:
        assert path == "/tokenize" and body["model"] == "m"
        self.calls += 1
        if self.fail:
            raise ServerProblem("cannot reach it")
        if self.answer is not None:
            return self.status, self.answer
        import re
        ids = [1] + [hash(piece) % 50000 + 2 for piece in re.findall(r" ?\w+|[^\w\s]| +$", body["prompt"])]
        return self.status, orjson.dumps({"count": len(ids), "max_model_len": 8192, "tokens": ids})


TEXT = "Memo m01, run abc. The audit team counted five pallets. Rosa checked the crates twice."


def test_the_longest_cut_of_exactly_n_tokens():
    server = WordServer()
    assert asyncio.run(prefix_text(server, TEXT, "m", 6)) == "Memo m01, run abc"     # BOS + 5 pieces
    assert asyncio.run(prefix_text(server, TEXT, "m", 8)) == "Memo m01, run abc. The"
    assert 5 < server.calls < 40                                                       # a binary search


def test_no_prefix_where_the_server_gives_no_token_ids():
    for answer in (b"not json", b"[1, 2, 3]", b'{"tokens": [1, "a", 3]}', b'{"tokens": [1.5, 2]}', b'{"count": 3}'):
        assert asyncio.run(prefix_text(WordServer(answer), TEXT, "m", 2)) is None, answer
    assert asyncio.run(prefix_text(WordServer(b'{"tokens": [1, 2, 3]}', status=404), TEXT, "m", 2)) is None
    assert asyncio.run(prefix_text(WordServer(fail=True), TEXT, "m", 2)) is None
    assert asyncio.run(prefix_text(WordServer(), TEXT, "m", 99)) is None               # more than the whole
