"""carls.torch: the bank's rows as a PyTorch layer.

    emb = carls.torch.DynamicEmbedding(bank, "words", dim=16)   # the table must exist (Client.create_table)
    x = emb(["the", "cat", "sat"])        # (3, 16) tensor, requires grad; unseen words get rows
    loss = model(x).sum(); loss.backward()  # pushes d loss / d row of every word to the bank

There is no vocabulary: any string is a key, and the bank creates a row the first time it sees one. The rows
are not parameters of the module: the bank owns them and its optimizer (the table's: sgd, adagrad, ...,
lazy or immediate) takes their step when backward pushes their gradients, while an ordinary torch optimizer
steps the rest of the model. Within one forward a key given several times is looked up once and its
gradient is the sum over its uses, as for a torch.nn.Embedding row.
"""
import numpy as np
import torch

from . import Client, InvalidArgument

__all__ = ["DynamicEmbedding", "prefetch"]


class _BankRows(torch.autograd.Function):
    """Rows of keys from the bank; backward pushes their gradients to it."""

    @staticmethod
    def forward(ctx, anchor, rows, client, table, keys, inverse, wait):
        ctx.client, ctx.table, ctx.keys, ctx.wait = client, table, keys, wait
        ctx.save_for_backward(inverse)
        ctx.n_keys = len(keys)
        return rows[inverse]

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        g = torch.zeros((ctx.n_keys, grad.shape[1]), dtype=torch.float32, device=grad.device)
        g.index_add_(0, inverse, grad.to(torch.float32))
        ctx.client.push_gradients(ctx.table, ctx.keys, g.cpu().numpy(), wait=ctx.wait)
        return None, None, None, None, None, None, None


class DynamicEmbedding(torch.nn.Module):
    """Embedding rows of a bank table, looked up by string keys. forward(keys) takes a list of str (or
    bytes) and returns a (len(keys), dim) float32 tensor on `device` that requires grad; backward pushes the
    gradient of each distinct key's row to the bank (Client.push_gradients), where the table's optimizer
    applies it. In eval mode (module.eval()) unseen keys are answered with their initial value without being
    inserted. With wait=False backward does not wait for the bank's acknowledgement (push_gradients(...,
    wait=False)): training goes on while the bank applies the step, the next lookups may not see it yet,
    and client.flush() collects the pushes (a failure shows there). The table must exist with this dim; a
    different dim raises carls.InvalidArgument."""

    def __init__(self, client, table, dim, device="cpu", wait=True):
        super().__init__()
        if not isinstance(client, Client):
            raise TypeError("DynamicEmbedding: client must be a carls.Client, not %s" % type(client).__name__)
        bank_dim = client.dim(table)
        if bank_dim != dim:
            raise InvalidArgument("DynamicEmbedding: table %s has dim %d, not %d" % (table, bank_dim, dim))
        self.client, self.table, self.dim, self.wait = client, table, dim, wait
        self.device = torch.device(device)
        # A leaf that requires grad, so the rows' tensor joins the autograd graph; it never gets a gradient.
        self._anchor = torch.zeros((), requires_grad=True)

    def extra_repr(self):
        return "table=%s, dim=%d, bank=%s" % (self.table, self.dim, self.client.endpoints)

    def lookup(self, keys, client=None):
        """The distinct keys of keys, their rows (numpy, read through client or the module's own) and the
        index of each key among them: forward's first half."""
        if isinstance(keys, (str, bytes)):
            raise TypeError("DynamicEmbedding: keys must be a list of str, not one %s" % type(keys).__name__)
        # The distinct keys in order of first use (a dict: exact for any key, and faster than np.unique).
        index = {}
        try:
            inverse = [index.setdefault(k, len(index)) for k in keys]
        except TypeError:
            raise TypeError("DynamicEmbedding: keys must be a flat list of str or bytes") from None
        uniq, inverse = list(index), np.array(inverse, np.int64)
        return uniq, (client or self.client).lookup(self.table, uniq, no_create=not self.training), inverse

    def rows(self, looked_up):
        """The tensor of a lookup's rows, joined to the autograd graph: forward's second half."""
        uniq, rows, inverse = looked_up
        rows_t = torch.from_numpy(rows).to(self.device)
        inverse_t = torch.from_numpy(inverse.astype(np.int64)).to(self.device)
        return _BankRows.apply(self._anchor, rows_t, self.client, self.table, uniq, inverse_t, self.wait)

    def forward(self, keys):
        return self.rows(self.lookup(keys))


def prefetch(batches, embedding, depth=2):
    """Yields (batch, rows) for each batch of an iterable, rows = embedding(keys) of the batch's keys (the
    batch itself, or its first item when it is a tuple), looked up up to depth batches ahead by a worker
    thread with its own client, so the bank's round trips overlap the training steps. Gradients flow as from
    embedding(keys). Rows read ahead do not yet hold the steps of the batches between."""
    import queue
    import threading

    own = embedding.client.clone()
    q = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def work():
        try:
            for b in batches:
                if stop.is_set():
                    return
                put((b, embedding.lookup(b[0] if isinstance(b, tuple) else b, own)))
        except BaseException as e:  # handed to the consumer
            put(e)
        finally:
            put(done)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item[0], embedding.rows(item[1])
    finally:
        stop.set()
        t.join()
        own.close()
