"""sol_ext.driver.pairs: the authors' pair sampler (``--pairs balanced``), and its former path sol_ext.pairs."""


import torch

from sol_ext.driver.pairs import balanced_pairs, sample_references


def test_balanced_pairs_cap_each_relation():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 30, (64,), generator=g)
    pairs = balanced_pairs(labels, tau=3, per_class=5, generator=g)
    assert pairs.shape[1] == 2 and bool((pairs[:, 0] < pairs[:, 1]).all())
    diff = labels[pairs[:, 0]] - labels[pairs[:, 1]]
    counts = [int((diff > 3).sum()), int((diff < -3).sum()), int((diff.abs() <= 3).sum())]
    assert counts == [5, 5, 5]
    assert len({tuple(p) for p in pairs.tolist()}) == pairs.shape[0]  # no duplicates


def test_sample_references_respects_the_chosen_relation():
    g = torch.Generator().manual_seed(0)
    train = torch.tensor([0, 0, 1, 5, 9, 9])
    anchors = torch.tensor([0, 9, 5, 5, 0])
    seen = set()
    for _ in range(50):
        ref = sample_references(anchors, train, tau=1, generator=g)
        assert bool(((ref >= 0) & (ref < train.numel())).all())
        seen |= {(int(a), int(train[r])) for a, r in zip(anchors, ref)}
    # anchor 0 meets references below (none), similar (0, 1) and above (5, 9)
    assert {(0, 0), (0, 1), (0, 5), (0, 9)} <= seen
    # only one training sample of rank 5: its similar reference is itself
    assert (5, 5) in seen
