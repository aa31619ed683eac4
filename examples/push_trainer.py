#!/usr/bin/env python3
"""An online trainer that pushes what it changed to Cumulus.

It trains a factorization machine (a weight and K factors per feature id)
with PyTorch on a synthetic click stream, and after each optimizer step
pushes the rows of the ids that step updated, as absolute values, to the
managers' push API: POST /push/v1/models/NAME, a KServe v2 JSON body
whose parameters name the producer and the batch's sequence. Only the
standard library talks HTTP.

    push_trainer.py --addr 127.0.0.1:8003 --model fm --token TOKEN \
        --bias B --dim K [--steps 20] [--out DIR]

The model's bias is not trained here (pushes carry rows, not the bias):
give the served model's. With --out, it writes DIR/requests.jsonl, KServe
requests over the ids it pushed, each with "want": the scores its own
forward pass gives, so a test can check what Cumulus serves.
"""
import argparse
import json
import os
import time
import urllib.error
import urllib.request

import torch


def push(addr, model, token, producer, seq, ids, rows):
    """Sends one batch; returns the answer (the delta holding it)."""
    body = {
        "parameters": {"producer": producer, "sequence": seq},
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [len(ids)], "data": ids},
            {"name": "values", "datatype": "FP32", "shape": [len(ids), len(rows[0])],
             "data": [v for r in rows for v in r]},
        ],
    }
    req = urllib.request.Request(f"http://{addr}/push/v1/models/{model}", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    for attempt in range(50):
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            answer = e.read().decode()
            if e.code in (429, 503):  # busy, or not the leader (yet): the same batch again
                time.sleep(0.2)
                continue
            raise SystemExit(f"push {seq}: {e.code} {answer}")
    raise SystemExit(f"push {seq}: still refused after 50 tries")


def fm_scores(bias, emb, rows):
    """The FM's probability per row (a list of ids, values 1)."""
    out = []
    for ids in rows:
        e = emb[torch.tensor(ids)]          # [n, 1+K]
        w, v = e[:, 0], e[:, 1:]
        s = v.sum(0)
        pair = 0.5 * (s * s - (v * v).sum(0)).sum()
        out.append(torch.sigmoid(bias + w.sum() + pair))
    return torch.stack(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:8003")
    ap.add_argument("--model", required=True)
    ap.add_argument("--token", default=os.environ.get("CUMULUS_PUSH_TOKEN", ""))
    ap.add_argument("--bias", type=float, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--ids", type=int, default=2000, help="feature ids 0..N-1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--producer", default="torch-trainer")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.manual_seed(7)
    emb = torch.nn.Parameter(torch.randn(a.ids, 1 + a.dim) * 0.05)
    opt = torch.optim.SGD([emb], lr=0.5)
    truth = torch.randn(a.ids) * 0.5
    touched = set()
    for step in range(1, a.steps + 1):
        rows = [torch.randint(0, a.ids, (8,)).tolist() for _ in range(64)]
        labels = torch.stack([(truth[torch.tensor(r)].sum() > 0).float() for r in rows])
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy(fm_scores(a.bias, emb, rows), labels)
        loss.backward()
        changed = sorted(set(i for r in rows for i in r))
        opt.step()
        touched.update(changed)
        with torch.no_grad():
            vals = emb[torch.tensor(changed)].tolist()
        ans = push(a.addr, a.model, a.token, a.producer, step, changed, vals)
        print(f"step {step}: loss {loss.item():.4f}, pushed {len(changed)} rows: version {ans.get('version')}", flush=True)
    if a.out:
        g = torch.Generator().manual_seed(11)
        ids = sorted(touched)
        with open(os.path.join(a.out, "requests.jsonl"), "w") as f, torch.no_grad():
            for _ in range(20):
                pick = torch.randperm(len(ids), generator=g)[:6].tolist()
                rows = [[ids[p] for p in pick[:3]], [ids[p] for p in pick[3:]]]
                want = fm_scores(a.bias, emb, rows).tolist()
                flat = [i for r in rows for i in r]
                f.write(json.dumps({"inputs": [
                    {"name": "ids", "datatype": "INT64", "shape": [len(flat)], "data": flat},
                    {"name": "row_splits", "datatype": "INT64", "shape": [3], "data": [0, 3, 6]}],
                    "want": want}) + "\n")


if __name__ == "__main__":
    main()
