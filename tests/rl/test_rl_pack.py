import torch

from flywheel.rl.pack import PrefixPack, pack_groups


def test_shared_prefixes_are_stored_once_and_paths_follow_each_sequence():
    pack = PrefixPack()
    seqs = [[1, 2, 3], [1, 2, 4, 5], [1, 2, 3, 6], [7]]
    assert [pack.new_nodes(s) for s in seqs[:1]] == [3]
    for s in seqs:
        pack.add(s)
    assert len(pack) == 3 + 2 + 1 + 1
    assert pack.new_nodes([1, 2, 4]) == 0 and pack.new_nodes([1, 9, 9]) == 2
    for seq, path in zip(seqs, pack.paths, strict=True):
        assert [pack.ids[n] for n in path] == seq and [pack.positions[n] for n in path] == list(
            range(len(seq))
        )
    assert pack.paths[2][:3] == pack.paths[0]


def test_the_mask_lets_a_node_see_exactly_itself_and_its_ancestors():
    pack = PrefixPack()
    for s in ([1, 2, 3], [1, 2, 4], [5]):
        pack.add(s)
    allowed = pack.mask()[0, 0] == 0
    a, b, c = pack.paths[0], pack.paths[1], pack.paths[2]
    assert allowed[a[2]].nonzero().flatten().tolist() == a
    assert allowed[b[2]].nonzero().flatten().tolist() == b
    assert allowed[c[0]].nonzero().flatten().tolist() == c
    assert pack.mask(torch.float32).min() == torch.finfo(torch.float32).min


def test_pack_groups_cut_in_order_under_the_node_budget():
    seqs = [[0] * 10 + [1], [0] * 10 + [2], [3] * 5, [4] * 30, [4] * 30 + [5]]
    assert [i for i, _ in pack_groups(seqs, 17)] == [[0, 1, 2], [3], [4]]
    assert [i for i, _ in pack_groups(seqs, 16)] == [[0, 1], [2], [3], [4]]  # 11 + 1 + 5 > 16
    assert [i for i, _ in pack_groups(seqs, 100)] == [[0, 1, 2, 3, 4]]
    assert len(pack_groups(seqs, 100)[0][1]) == 11 + 1 + 5 + 30 + 1  # the filled tree comes back too
