"""carls.torch.DynamicEmbedding against a real kb-server: its gradients reach the bank as the SGD step they
should make, it mixes with ordinary torch layers, and the example trains end to end."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import carls

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
import carls.torch as ct  # noqa: E402

from conftest import ROOT  # noqa: E402


def test_forward_rows_and_grad_flag(bank, table_name):
    bank.create_table(table_name, dim=3, init="uniform", init_scale=0.5, seed=5)
    emb = ct.DynamicEmbedding(bank, table_name, 3)
    x = emb(["b", "a", "b"])
    assert x.shape == (3, 3) and x.dtype == torch.float32 and x.requires_grad
    np.testing.assert_array_equal(x.detach().numpy(), bank.lookup(table_name, ["b", "a", "b"]))
    # keys are exact: a trailing NUL makes another key (numpy's fixed-width strings would drop it)
    y = emb([b"a", b"a\x00", "a"])
    assert not torch.equal(y[0], y[1]) and torch.equal(y[0], y[2])


def test_backward_is_the_sgd_step(bank, table_name):
    """update=immediate, SGD: after one forward/backward of loss = sum(x * W), whose gradient with respect to
    row i of x is W[i], each key's row is its initial row minus lr times the sum of W over its uses."""
    lr = 0.25
    bank.create_table(table_name, dim=4, optimizer="sgd", lr=lr, update="immediate", init="uniform",
                      init_scale=1.0, seed=2)
    keys = ["cat", "dog", "cat", "emu", "cat"]
    initial = bank.lookup(table_name, ["cat", "dog", "emu"])
    emb = ct.DynamicEmbedding(bank, table_name, 4)
    W = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 10 - 1
    (emb(keys) * W).sum().backward()
    g = W.numpy()
    expected = initial - lr * np.stack([g[0] + g[2] + g[4], g[1], g[3]])
    np.testing.assert_allclose(bank.lookup(table_name, ["cat", "dog", "emu"]), expected, rtol=1e-6, atol=1e-6)


def test_backward_without_waiting(bank, table_name):
    """wait=False: backward returns before the bank acknowledges; after flush() the step is the same."""
    bank.create_table(table_name, dim=2, optimizer="sgd", lr=0.5, update="immediate", init="uniform",
                      init_scale=1.0, seed=8)
    initial = bank.lookup(table_name, ["p", "q"])
    emb = ct.DynamicEmbedding(bank, table_name, 2, wait=False)
    W = torch.tensor([[1.0, -2.0], [0.5, 4.0], [3.0, 3.0]])
    (emb(["p", "q", "p"]) * W).sum().backward()
    bank.flush()
    g = W.numpy()
    np.testing.assert_allclose(bank.lookup(table_name, ["p", "q"]), initial - 0.5 * np.stack([g[0] + g[2], g[1]]),
                               rtol=1e-6, atol=1e-6)


def test_mixes_with_torch_layers_and_optimizers(bank, table_name):
    """One step of a model with a bank embedding and a torch Linear: both move, each by its optimizer."""
    bank.create_table(table_name, dim=2, optimizer="sgd", lr=0.5, update="immediate", init="uniform",
                      init_scale=0.5, seed=4)
    torch.manual_seed(0)
    emb, lin = ct.DynamicEmbedding(bank, table_name, 2), torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before_rows, before_w = bank.lookup(table_name, ["x", "y"]), lin.weight.detach().clone()
    x = emb(["x", "y"])
    loss = lin(x).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    # d loss / d row_i = 2 * lin(row_i) * w
    g = (2 * lin(x).detach() * lin.weight.detach()).numpy()
    opt.step()
    np.testing.assert_allclose(bank.lookup(table_name, ["x", "y"]), before_rows - 0.5 * g, rtol=1e-5, atol=1e-6)
    assert not torch.equal(lin.weight.detach(), before_w)
    assert list(emb.parameters()) == []  # the rows belong to the bank


def test_eval_mode_creates_no_rows(bank, table_name):
    bank.create_table(table_name, dim=2)
    emb = ct.DynamicEmbedding(bank, table_name, 2)
    emb.eval()
    with torch.no_grad():
        emb(["unseen"])
    assert bank.stats(table_name)["tables"][0]["rows"] == 0
    emb.train()
    emb(["unseen"])
    assert bank.stats(table_name)["tables"][0]["rows"] == 1


def test_wrong_dim_and_keys(bank, table_name):
    bank.create_table(table_name, dim=2)
    with pytest.raises(carls.InvalidArgument, match="has dim 2, not 3"):
        ct.DynamicEmbedding(bank, table_name, 3)
    with pytest.raises(carls.NotFound):
        ct.DynamicEmbedding(bank, "no_such_table", 3)
    emb = ct.DynamicEmbedding(bank, table_name, 2)
    with pytest.raises(TypeError):
        emb("one string")
    with pytest.raises(TypeError):
        emb([1, 2])


def test_prefetch_gives_the_same_rows_and_gradients(bank, table_name):
    bank.create_table(table_name, dim=2, optimizer="sgd", lr=1.0, update="immediate")
    emb = ct.DynamicEmbedding(bank, table_name, 2)
    batches = [["a", "b"], ["c"], ["a"]]
    seen = []
    for batch, rows in ct.prefetch(batches, emb, depth=1):
        seen.append(batch)
        assert rows.shape == (len(batch), 2) and rows.requires_grad
        rows.sum().backward()
    assert seen == batches
    # every use pushed a gradient of ones: a twice, b and c once
    np.testing.assert_allclose(bank.lookup(table_name, ["a", "b", "c"]), [[-2, -2], [-1, -1], [-1, -1]])


@pytest.mark.skipif(shutil.which("bible") is None, reason="the bible program (bible-kjv) is not installed")
def test_example_trains(server):
    """examples/kjv_testament.py end to end on a small split: it must beat chance clearly and come within 0.05
    of the same model trained with a local torch.nn.Embedding (--baseline)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "kjv_testament.py"), "--bank",
                          server.endpoint, "--train", "400", "--test", "200", "--epochs", "2", "--baseline"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    bank_line = [x for x in lines if x.startswith("test accuracy: ")]
    base_line = [x for x in lines if x.startswith("baseline test accuracy: ")]
    assert len(bank_line) == 1 and len(base_line) == 1, out.stdout
    acc, base = float(bank_line[0].split()[2]), float(base_line[0].split()[3])
    assert acc > 0.7, out.stdout  # chance is 0.5 (balanced classes)
    assert acc >= base - 0.05, out.stdout


def test_prefetch_stopped_early_and_failing(bank, table_name):
    """A consumer that stops early ends the worker (close() returns); a failing lookup reaches the consumer."""
    bank.create_table(table_name, dim=2)
    emb = ct.DynamicEmbedding(bank, table_name, 2)
    gen = ct.prefetch((["k%d" % i] for i in range(1000)), emb, depth=2)
    next(gen)
    gen.close()
    with pytest.raises(TypeError):
        for _ in ct.prefetch([["a"], "not a list"], emb):
            pass


def test_sharded_bank_step(shards):
    """Over a bank of two shards the step is the same: each key's row lives on its shard."""
    with carls.Client([s.endpoint for s in shards]) as bank:
        bank.create_table("torch_sharded", dim=2, optimizer="sgd", lr=0.1, update="immediate", init="uniform",
                          init_scale=1.0, seed=6)
        keys = ["w%d" % i for i in range(20)]
        initial = bank.lookup("torch_sharded", keys)
        emb = ct.DynamicEmbedding(bank, "torch_sharded", 2)
        W = torch.arange(40, dtype=torch.float32).reshape(20, 2) / 10
        (emb(keys) * W).sum().backward()
        np.testing.assert_allclose(bank.lookup("torch_sharded", keys), initial - 0.1 * W.numpy(), rtol=1e-6,
                                   atol=1e-6)
        assert all(bank.stats("torch_sharded", shard=i)["tables"][0]["rows"] > 0 for i in range(2))
