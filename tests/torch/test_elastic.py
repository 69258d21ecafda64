"""cohort_torch.elastic on one machine: the elastic sampler continues an epoch exactly on any
world size, State checks its names, and the elastic example is the plain DDP example with
at most 10 changed lines that trains to the same parameters (the same digest on every rank
and in both scripts) and resumes from its checkpoint as the plain one does.

The loss, join and loss-during-a-re-form sequences across nodes are in
tests/cluster/test_torch_sequences.py (they need root for network namespaces).
"""
import difflib
import ast
import re
from pathlib import Path

import pytest

import e2e_util as U

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "examples" / "fashion_ddp.py"
ELASTIC = ROOT / "examples" / "fashion_elastic.py"
DATA = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.fixture
def elastic(in_process):
    import cohort_torch.elastic as module
    return module


def sampler_with_world(elastic, size, batch, world_box):
    data = list(range(size))
    sampler = elastic.ElasticSampler(data, batch, shuffle=True, seed=7)
    # The group the sampler sees: (rank, world) from the box, as dist would answer.
    sampler._group = lambda: (world_box[0], world_box[1])
    return sampler


def take_steps(sampler, world_box, world, steps):
    """`steps` steps of a group of `world` ranks: what each rank's loader would train."""
    per_rank = []
    for rank in range(world):
        world_box[:] = [rank, world]
        order = list(iter(sampler))
        per_rank.append(order)
    world_box[:] = [0, world]
    trained = []
    for s in range(steps):
        batch = [x for r in range(world) for x in per_rank[r][s * sampler.batch_size:
                                                              (s + 1) * sampler.batch_size]]
        if not batch:
            break
        trained.extend(batch)
        sampler.advance()
    return trained


@pytest.mark.parametrize("worlds", [(3, 2, 4), (1, 5), (4, 4, 1, 3)])
def test_sampler_continues_an_epoch_exactly_across_world_sizes(elastic, worlds):
    size, batch = 103, 4
    box = [0, 1]
    sampler = sampler_with_world(elastic, size, batch, box)
    sampler.set_epoch(2)
    trained = []
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1
        trained += take_steps(sampler, box, world, 10**6 if last else 3)
    # Every sample of the epoch once, in no matter which group; only the padding of the
    # epoch's tail (fewer than the last world size) is trained twice.
    counts = {x: trained.count(x) for x in set(trained)}
    assert set(counts) == set(range(size))
    twice = [x for x, n in counts.items() if n > 1]
    assert len(trained) - size == len(twice) < worlds[-1], (worlds, twice)
    assert sampler.position == size
    sampler.set_epoch(2)  # the same epoch again after a re-form: continues, does not restart
    assert sampler.position == size
    sampler.set_epoch(3)
    assert sampler.position == 0


def test_sampler_deals_as_distributed_sampler_on_a_fixed_world(elastic, need_torch):
    from torch.utils.data.distributed import DistributedSampler
    data = list(range(50))
    box = [0, 1]
    sampler = sampler_with_world(elastic, len(data), 4, box)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        for rank in range(3):
            box[:] = [rank, 3]
            theirs = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=True, seed=7)
            theirs.set_epoch(epoch)
            assert list(iter(sampler)) == list(iter(theirs)), (epoch, rank)
            assert len(sampler) == len(theirs)


def test_sampler_state_round_trips_and_rejects_a_bad_batch(elastic):
    box = [0, 2]
    a = sampler_with_world(elastic, 40, 3, box)
    a.set_epoch(4)
    a.advance()
    b = sampler_with_world(elastic, 40, 3, box)
    b.load_state_dict(a.state_dict())
    assert (b.epoch, b.position) == (4, 6)
    assert list(iter(a)) == list(iter(b))
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        elastic.ElasticSampler(range(4), 0)


def test_state_refuses_a_value_named_like_its_own(elastic):
    with pytest.raises(ValueError, match="'step' is a name State uses itself"):
        elastic.State(step=3)


def code_lines(path):
    """The script's lines without its module docstring (the prose may differ)."""
    lines = path.read_text().splitlines()
    first = ast.parse("\n".join(lines)).body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant), path
    return lines[:first.lineno - 1] + lines[first.end_lineno:]


def test_the_elastic_example_is_at_most_ten_changed_lines():
    plain, elastic_lines = code_lines(PLAIN), code_lines(ELASTIC)
    diff = list(difflib.unified_diff(plain, elastic_lines, lineterm="", n=0))
    added = [l for l in diff if l.startswith("+") and not l.startswith("+++")]
    assert 0 < len(added) <= 10, "\n".join(diff)


def digests(text):
    line = r"^(?:\[rank\d+\]: )?rank (\d+) digest ([0-9a-f]{8})$"
    return {int(r): d for r, d in re.findall(line, text, re.M)}


def run_script(cohort, launcher, tmp_path, script, ckpt, epochs, name):
    argv = [cohort, "run", "--nproc-per-node", 2, "--log-dir", tmp_path / ("logs-" + name),
            script, "--ckpt", ckpt, "--epochs", epochs, "--limit", 1200, "--batch", 16]
    p = launcher.run(argv, timeout=300, name=name, env=U.clean_env())
    assert p.p.returncode == 0, p.describe()
    d = digests(p.stdout)
    assert sorted(d) == [0, 1] and d[0] == d[1], p.stdout
    return d[0], p


def test_the_elastic_example_trains_and_resumes_like_the_plain_one(cohort, pydir, launcher,
                                                                   tmp_path):
    if not DATA.exists():
        pytest.skip("dataset-fashion-mnist is not installed")
    m = launcher.marker
    plain, _ = run_script(cohort, launcher, tmp_path, PLAIN, tmp_path / (m + "-plain.pt"), 2,
                          "plain")
    whole, p = run_script(cohort, launcher, tmp_path, ELASTIC, tmp_path / (m + "-whole.pt"), 2,
                          "whole")
    assert whole == plain  # same order of samples, same steps: the same parameters
    # One node: no other node can come or go, so no live round ("round -").
    assert re.search(r"cohort_torch\.elastic: rank 0 of 2 round \S+ pid \d+ step 0$",
                     p.stdout, re.M), p.stdout
    ckpt = tmp_path / (m + "-split")
    run_script(cohort, launcher, tmp_path, ELASTIC, ckpt, 1, "first")
    resumed, p = run_script(cohort, launcher, tmp_path, ELASTIC, ckpt, 2, "second")
    assert re.search(r"rank 1 of 2 .* \(resumed from .*-split/\S+, step \d+\)", p.stdout), \
        p.stdout
    assert resumed == plain
