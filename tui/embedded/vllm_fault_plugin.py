"""hitproof's in-engine faults for vLLM's hybrid prefix cache: the field report's bug, made inside vLLM.

Installed into the embedded vLLM's environment as the distribution `hitproof-vllm-faults` (module
`hitproof_vllm_faults`, vLLM's `vllm.general_plugins` entry point: tui/embedded/vllm_faults.py builds and
installs it). vLLM loads general plugins in every process; this one does nothing at all unless the
variable HITPROOF_VLLM_FAULT names a fault, and then it wraps one function of the model runner:
`vllm.v1.worker.mamba_utils.preprocess_mamba`, which in `mamba_cache_mode=align` copies the recurrent
state checkpointed at the last grid line a hit shares into the request's running block. For every
restore (a request whose first step starts past token 0 with a cached prefix), after vLLM's own copy:

  zero_state        the restored state is zeros (conv and SSM states): "forgot the first N tokens"
  foreign_state     the restored state is another request's: the running state of the request at the
                    next batch row (a block table read by batch row instead of request slot), or, alone
                    in the batch, the state the previous restore of another prompt carried
  stale_checkpoint  the restored state is this prompt's state at an earlier grid line (one the engine
                    wrote at a chunk end or restored before), used at the later position
  unwritten_slot    vLLM's copy is skipped: the running block keeps whatever its previous user left
                    there (a restore from a slot nothing wrote for this prefix)

Each applied fault prints one line on the worker's standard error:
`hitproof-fault FAULT: request R restored at token N: WHAT`. Nothing of hitproof is imported here (the
checks that judge the engine share no code with the fault), and nothing of vLLM is imported unless a
fault is named. An unknown name stops the server's start with one line naming the known ones.
"""

from __future__ import annotations

import collections
import hashlib
import os
import sys

VARIABLE = "HITPROOF_VLLM_FAULT"
FAULTS = ("zero_state", "foreign_state", "stale_checkpoint", "unwritten_slot")
_SNAPSHOTS = 64            # states kept for stale_checkpoint (a tiny model's is ~0.6 MB)
_patched = False


def register() -> None:
    """vLLM's general-plugin hook: called once in every vLLM process."""
    global _patched
    name = os.environ.get(VARIABLE, "").strip()
    if not name or _patched:
        return
    if name not in FAULTS:
        # SystemExit with a message: one line on standard error, exit status 1, no traceback
        raise SystemExit(f"hitproof-vllm-faults: unknown fault {name!r} in {VARIABLE}; known: {', '.join(FAULTS)}")
    from vllm.v1.worker import mamba_utils

    mamba_utils.preprocess_mamba = _Fault(name, mamba_utils.preprocess_mamba)
    _patched = True
    print(f"hitproof-fault {name}: armed in process {os.getpid()}", file=sys.stderr, flush=True)


def _prefix_key(tokens, end: int) -> str:
    return hashlib.blake2b(repr(list(tokens[:end])).encode(), digest_size=16).hexdigest()


class _Fault:
    """preprocess_mamba with one fault applied to every restore it performs."""

    def __init__(self, name: str, original):
        self.name = name
        self.original = original
        self.applied = 0
        self.previous = None        # foreign_state alone in the batch: (prefix key, states) of the last restore
        self.snapshots: collections.OrderedDict = collections.OrderedDict()   # (line, key) -> states
        self.pending: list = []     # stale_checkpoint: (req_id, line, prompt key, dest blocks) written this step

    def __call__(self, scheduler_output, kv_cache_config, cache_config, mamba_state_idx, input_batch, requests,
                 forward_context, copy_funcs, copy_bufs, *args, **kwargs):
        block_size = copy_bufs.mamba_spec.block_size
        spec_blocks = copy_bufs.mamba_spec.num_speculative_blocks
        groups = copy_bufs.mamba_group_ids
        layers = [(gid, layer) for gid in groups for layer in kv_cache_config.kv_cache_groups[gid].layer_names]
        if self.name == "stale_checkpoint":
            self._keep_pending(forward_context, layers)
        restores = []
        for row, req_id in enumerate(input_batch.req_ids):
            state = requests[req_id]
            if mamba_state_idx.get(req_id) is None and state.num_computed_tokens > 0:
                restores.append((row, req_id, state.num_computed_tokens))
                if self.name == "unwritten_slot":
                    # what vLLM computes as the running block: with it already recorded, no copy happens
                    scheduled = scheduler_output.num_scheduled_tokens[req_id]
                    blocks = -(-(state.num_computed_tokens + scheduled) // block_size) + spec_blocks
                    mamba_state_idx[req_id] = blocks - 1 - spec_blocks
        result = self.original(scheduler_output, kv_cache_config, cache_config, mamba_state_idx, input_batch,
                               requests, forward_context, copy_funcs, copy_bufs, *args, **kwargs)
        for row, req_id, line in restores:
            self._apply(row, req_id, line, input_batch, requests, mamba_state_idx, forward_context, layers)
        if self.name == "stale_checkpoint":
            self._note_aligned(scheduler_output, input_batch, requests, mamba_state_idx, block_size, groups)
        return result

    # -- the states of one request's running block ----------------------------------------------------

    @staticmethod
    def _states(forward_context, layers, block_of):
        """[(layer, index, tensor view)] of the recurrent states in the block `block_of(gid)`."""
        out = []
        for gid, layer in layers:
            block = block_of(gid)
            for index, cache in enumerate(forward_context[layer].kv_cache):
                out.append(((layer, index), cache[block]))
        return out

    def _apply(self, row, req_id, line, input_batch, requests, mamba_state_idx, forward_context, layers) -> None:
        state = requests[req_id]
        curr = mamba_state_idx[req_id]
        dest = self._states(forward_context, layers, lambda gid: state.block_ids[gid][curr])
        key = _prefix_key(state.prompt_token_ids or [], line)
        what = None
        if self.name == "zero_state":
            for _, view in dest:
                view.zero_()
            what = "state zeroed"
        elif self.name == "unwritten_slot":
            what = "vLLM's copy skipped: the running block keeps what its last user left"
        elif self.name == "foreign_state":
            what = self._foreign(row, req_id, line, key, dest, input_batch, requests, mamba_state_idx,
                                 forward_context, layers)
        elif self.name == "stale_checkpoint":
            what = self._stale(line, key, dest, state.prompt_token_ids or [])
        if what is None:
            return
        self.applied += 1
        print(f"hitproof-fault {self.name}: request {req_id} restored at token {line}: {what} "
              f"({self.applied} so far)", file=sys.stderr, flush=True)

    def _foreign(self, row, req_id, line, key, dest, input_batch, requests, mamba_state_idx, forward_context,
                 layers):
        true_state = [(k, view.clone()) for k, view in dest]
        ids = input_batch.req_ids
        other = next((ids[(row + step) % len(ids)] for step in range(1, len(ids))
                      if mamba_state_idx.get(ids[(row + step) % len(ids)]) is not None), None)
        what = None
        if other is not None:
            other_state, other_idx = requests[other], mamba_state_idx[other]
            source = self._states(forward_context, layers, lambda gid: other_state.block_ids[gid][other_idx])
            for (_, view), (_, src) in zip(dest, source):
                view.copy_(src)
            what = f"state of request {other} (batch row {ids.index(other)}) put in its place"
        elif self.previous is not None and self.previous[0] != key:
            for (_, view), (_, src) in zip(dest, self.previous[1]):
                view.copy_(src)
            what = "state of the previous restore (another prompt) put in its place"
        self.previous = (key, true_state)
        return what

    # -- stale_checkpoint: states this prompt had at earlier grid lines ---------------------------------

    def _remember(self, line, key, states) -> None:
        self.snapshots[(line, key)] = states
        self.snapshots.move_to_end((line, key))
        while len(self.snapshots) > _SNAPSHOTS:
            self.snapshots.popitem(last=False)

    def _stale(self, line, key, dest, prompt):
        earlier = None
        for (old_line, old_key) in reversed(self.snapshots):
            if old_line < line and (earlier is None or old_line > earlier[0]) and old_key == _prefix_key(prompt, old_line):
                earlier = (old_line, old_key)
        self._remember(line, key, [(k, view.clone()) for k, view in dest])
        if earlier is None:
            return None          # nothing earlier of this prompt: the restore stays right (not counted)
        for (_, view), (_, src) in zip(dest, self.snapshots[earlier]):
            view.copy_(src)
        return f"state of token {earlier[0]} of the same prompt used at token {line}"

    def _note_aligned(self, scheduler_output, input_batch, requests, mamba_state_idx, block_size, groups) -> None:
        """Requests whose step ends on a grid line: their running block holds that line's state after it."""
        for req_id in input_batch.req_ids:
            state = requests[req_id]
            end = state.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            prompt = state.prompt_token_ids or []
            if end % block_size == 0 and 0 < end <= len(prompt) and req_id in mamba_state_idx:
                curr = mamba_state_idx[req_id]
                self.pending.append((end, _prefix_key(prompt, end), {g: state.block_ids[g][curr] for g in groups}))

    def _keep_pending(self, forward_context, layers) -> None:
        for end, key, blocks in self.pending:
            states = self._states(forward_context, layers, lambda gid: blocks[gid])
            self._remember(end, key, [(k, view.clone()) for k, view in states])
        self.pending = []
