#!/usr/bin/python3
"""Train a small FFM and a small embedding + MLP (DNN) model with PyTorch on
synthetic data, export them in Cumulus's formats, and write requests with
PyTorch's own forward-pass scores.

    /usr/bin/python3 scripts/torch_models.py OUT_DIR

writes OUT_DIR/ffm.tsv, OUT_DIR/dnn.tsv, OUT_DIR/dnn.safetensors (the
Sequential's state_dict, written by hand: no safetensors package is
installable from Debian) and OUT_DIR/{ffm,dnn}.requests.jsonl: one KServe
v2 infer body per line (typed JSON inputs) with "want", PyTorch's score of
each row, its own features and the shared ones together. Feature id's
field is id mod F (docs/model-format.md). Needs Debian's python3-torch.
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn

N_IDS = 600
SEED = 7


class FFM(nn.Module):
    def __init__(self, n_ids, fields, dim):
        super().__init__()
        self.F, self.k = fields, dim
        self.w = nn.Embedding(n_ids, 1)
        self.v = nn.Embedding(n_ids, fields * dim)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.w.weight, std=0.1)
        nn.init.normal_(self.v.weight, std=0.1)

    def forward(self, ids, fields, xs):
        # ids, fields, xs: [B, L], padding has x = 0.
        B, L = ids.shape
        lin = (self.w(ids).squeeze(-1) * xs).sum(1)
        V = self.v(ids).view(B, L, self.F, self.k)
        # A[b, i, j] = v_{i, f_j}
        idx = fields[:, None, :, None].expand(B, L, L, self.k)
        A = torch.gather(V, 2, idx)
        pair = (A * A.transpose(1, 2)).sum(-1) * xs[:, :, None] * xs[:, None, :]
        return torch.sigmoid(self.bias + lin + torch.triu(pair, diagonal=1).sum((1, 2)))


class DNN(nn.Module):
    def __init__(self, n_ids, fields, dim, dense, hidden, pooling):
        super().__init__()
        self.F, self.k, self.pooling = fields, dim, pooling
        self.emb = nn.Embedding(n_ids, dim)
        self.wide = nn.Embedding(n_ids, 1)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.emb.weight, std=0.3)
        nn.init.normal_(self.wide.weight, std=0.05)
        layers, width = [], fields * dim + dense
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, ids, fields, xs, mask, dense):
        B, L = ids.shape
        e = self.emb(ids) * xs[..., None]  # [B, L, k]
        onehot = nn.functional.one_hot(fields, self.F).to(e.dtype) * mask[..., None]  # [B, L, F]
        pooled = torch.einsum("blf,blk->bfk", onehot, e)
        if self.pooling == "mean":
            pooled = pooled / onehot.sum(1).clamp(min=1)[..., None]
        u = torch.cat([pooled.reshape(B, self.F * self.k), dense], 1)
        wide = (self.wide(ids).squeeze(-1) * xs).sum(1)
        return torch.sigmoid(self.bias + wide + self.mlp(u).squeeze(-1))


def batch(gen, rows, own_max, shared, F):
    """A request: rows of own features plus shared ones, as padded tensors
    of whole rows (own then shared) and as the request's inputs."""
    sh_ids = torch.randint(0, N_IDS, (shared,), generator=gen)
    sh_x = torch.rand(shared, generator=gen) + 0.5
    req = {"ids": [], "fields": [], "values": [], "row_splits": [0],
           "shared_ids": sh_ids.tolist(), "shared_fields": (sh_ids % F).tolist(), "shared_values": sh_x.tolist()}
    L = own_max + shared
    ids = torch.zeros(rows, L, dtype=torch.long)
    xs = torch.zeros(rows, L, dtype=torch.float64)
    mask = torch.zeros(rows, L, dtype=torch.float64)
    for r in range(rows):
        n = int(torch.randint(0, own_max + 1, (1,), generator=gen))
        own = torch.randint(0, N_IDS, (n,), generator=gen)
        x = torch.rand(n, generator=gen) + 0.5
        req["ids"] += own.tolist()
        req["fields"] += (own % F).tolist()
        req["values"] += x.tolist()
        req["row_splits"].append(len(req["ids"]))
        ids[r, :n], xs[r, :n], mask[r, :n] = own, x.double(), 1
        ids[r, own_max:], xs[r, own_max:], mask[r, own_max:] = sh_ids, sh_x.double(), 1
    return req, ids, ids % F, xs, mask


def train(model, step, steps=150):
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        p, y = step()
        loss = nn.functional.binary_cross_entropy(p.clamp(1e-6, 1 - 1e-6), y)
        loss.backward()
        opt.step()


def as_f32(t):
    """Values as the exact decimals of their float32s."""
    return [repr(float(x)) for x in t.detach().float().flatten().tolist()]


def kserve(req, dense_rows=None):
    def inp(name, dtype, data, shape=None):
        return {"name": name, "datatype": dtype, "shape": shape or [len(data)], "data": data}
    inputs = [inp("ids", "INT64", req["ids"]), inp("row_splits", "INT64", req["row_splits"]),
              inp("fields", "INT32", req["fields"]), inp("values", "FP32", req["values"]),
              inp("shared_ids", "INT64", req["shared_ids"]), inp("shared_fields", "INT32", req["shared_fields"]),
              inp("shared_values", "FP32", req["shared_values"])]
    if dense_rows is not None:
        inputs.append(inp("dense", "FP32", dense_rows, [len(dense_rows), len(dense_rows[0])]))
    return inputs


def write_safetensors(path, state):
    header, data = {}, b""
    for name, t in state.items():
        raw = t.detach().float().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    # Requests round values to float32 on the wire: so do the inputs the
    # scores are computed from.
    f32 = lambda t: t.float().double()

    # FFM: F = 4 fields of k = 3.
    F, k = 4, 3
    truth = FFM(N_IDS, F, k)
    ffm = FFM(N_IDS, F, k)

    def ffm_step():
        _, ids, fields, xs, _ = batch(gen, 64, 8, 4, F)
        with torch.no_grad():
            y = (truth(ids, fields, xs.float()) > 0.5).float()
        return ffm(ids, fields, xs.float()), y
    train(ffm, ffm_step)
    with open(os.path.join(out, "ffm.tsv"), "w") as f:
        f.write(f"# FFM trained by scripts/torch_models.py\ntype ffm\nfields {F}\ndim {k}\nbias {as_f32(ffm.bias)[0]}\n")
        for i in range(N_IDS):
            f.write("\t".join([str(i)] + as_f32(ffm.w.weight[i]) + as_f32(ffm.v.weight[i])) + "\n")
    ffm64 = ffm.double()
    with open(os.path.join(out, "ffm.requests.jsonl"), "w") as f:
        for _ in range(8):
            req, ids, fields, xs, _ = batch(gen, 150, 12, 10, F)
            with torch.no_grad():
                want = ffm64(ids, fields, f32(xs))
            f.write(json.dumps({"inputs": kserve(req), "want": want.tolist()}) + "\n")

    # DNN: F = 5 fields of k = 4, D = 3 continuous features, mean pooling,
    # hidden 32, 16; its Sequential is the module's mlp.
    F, k, D = 5, 4, 3
    dnn = DNN(N_IDS, F, k, D, [32, 16], "mean")
    truth = DNN(N_IDS, F, k, D, [8], "mean").double()

    def dnn_step():
        _, ids, fields, xs, mask = batch(gen, 64, 8, 4, F)
        dense = torch.randn(64, D, generator=gen)
        with torch.no_grad():
            y = (truth(ids, fields, xs, mask, dense.double()) > 0.5).float()
        return dnn(ids, fields, xs.float(), mask.float(), dense), y
    train(dnn, dnn_step)
    with open(os.path.join(out, "dnn.tsv"), "w") as f:
        f.write(f"type dnn\nfields {F}\ndim {k}\npooling mean\ndense {D}\nbias {as_f32(dnn.bias)[0]}\n")
        for i in range(N_IDS):
            f.write("\t".join([str(i)] + as_f32(dnn.wide.weight[i]) + as_f32(dnn.emb.weight[i])) + "\n")
    write_safetensors(os.path.join(out, "dnn.safetensors"), {"mlp." + n: t for n, t in dnn.mlp.state_dict().items()})
    dnn64 = dnn.double()
    with open(os.path.join(out, "dnn.requests.jsonl"), "w") as f:
        for _ in range(8):
            req, ids, fields, xs, mask = batch(gen, 150, 12, 10, F)
            dense = torch.randn(150, D, generator=gen).float()
            with torch.no_grad():
                want = dnn64(ids, fields, f32(xs), mask, dense.double())
            f.write(json.dumps({"inputs": kserve(req, dense.tolist()), "want": want.tolist()}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
