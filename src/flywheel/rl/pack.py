"""Prefix-tree packing: many token sequences that share prefixes, as one sequence with a tree mask.

The trainer replays every assistant turn as `prompt_ids + token_ids`. Those sequences overlap a lot: the
G rollouts of a group start with the same prompt, and turn k+1 of an episode usually starts with turn k's
prompt and generated tokens. Padding each turn into its own row recomputes every shared prefix once per
turn (an episode of n turns costs about n/2 times its final length).

`PrefixPack` inserts the sequences into a trie of tokens, so each distinct prefix appears once. The trie's
nodes, in insertion order (a parent always comes before its children), form one packed sequence:
- `ids[i]`: node i's token; `positions[i]`: its depth, the position it had in every sequence through it;
- `mask(...)`: node i attends to node j exactly when j is i itself or one of its ancestors, which is the
  causal attention each original sequence had, so a decoder run over the pack with these positions gives
  every node the hidden state it had in each of its sequences (up to float rounding);
- `paths[k]`: the node of each position of sequence k, so position p of sequence k is read at
  `paths[k][p]`.

Sharing is exact: two sequences share a node only when their token ids agree on the whole prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PrefixPack:
    """A trie of token sequences (see the module docstring); `add` returns the sequence's index."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.parents: list[int] = []
        self.positions: list[int] = []
        self.paths: list[list[int]] = []
        self._children: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def new_nodes(self, seq: Sequence[int]) -> int:
        """How many nodes `add(seq)` would create."""
        node = -1
        for depth, tok in enumerate(seq):
            node = self._children.get((node, tok), -2)
            if node == -2:
                return len(seq) - depth
        return 0

    def add(self, seq: Sequence[int]) -> int:
        node, path = -1, []
        for depth, tok in enumerate(seq):
            child = self._children.get((node, tok))
            if child is None:
                child = len(self.ids)
                self.ids.append(int(tok))
                self.parents.append(node)
                self.positions.append(depth)
                self._children[(node, tok)] = child
            node = child
            path.append(node)
        self.paths.append(path)
        return len(self.paths) - 1

    def mask(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Additive attention mask `[1, 1, N, N]`: 0 where node i may attend to node j, the dtype's min
        elsewhere."""
        n = len(self.ids)
        allowed = torch.zeros((n, n), dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                allowed[i] = allowed[parent]
            allowed[i, i] = True
        out = torch.zeros((n, n), dtype=dtype)
        out.masked_fill_(~allowed, torch.finfo(dtype).min)
        return out[None, None]


def pack_groups(seqs: Sequence[Sequence[int]], max_nodes: int) -> list[tuple[list[int], PrefixPack]]:
    """`seqs` split, in order, into packs of at most `max_nodes` trie nodes each (a sequence longer than
    `max_nodes` gets a pack of its own): (indices into `seqs`, their filled `PrefixPack`) per pack. Keep
    sequences that share prefixes next to each other: packs are cut in the given order."""
    packs: list[tuple[list[int], PrefixPack]] = []
    for i, seq in enumerate(seqs):
        if not packs or len(packs[-1][1]) + packs[-1][1].new_nodes(seq) > max_nodes:
            packs.append(([], PrefixPack()))
        indices, pack = packs[-1]
        pack.add(seq)
        indices.append(i)
    return packs
