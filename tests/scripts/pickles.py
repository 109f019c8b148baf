"""Test job: pickles and DataLoader workers (forked, and one spawned) give the same answer under the launcher's
hook as without it. Prints one `result <json>` line: the batches' sums, the trained weights, and whether the model,
a checkpoint and the methods the hook wraps come back from a pickle as they went in."""

import io
import json
import pickle

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64, torch.ones(16, 2))
    sums = {}
    for context, workers in (("fork", 2), ("spawn", 1)):
        total = 0.0
        for x, y in DataLoader(data, batch_size=4, num_workers=workers, multiprocessing_context=context):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(x.sum())
        sums[context] = total
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()))
    again = pickle.loads(pickle.dumps(model))
    methods = [pickle.loads(pickle.dumps(m)) is m for m in (torch.Tensor.backward, _BaseDataLoaderIter.__next__)]
    result = {"sums": sums, "weights": [round(v, 5) for v in model.weight.flatten().tolist()],
              "model": torch.equal(again.weight, model.weight), "methods": methods,
              "checkpoint": torch.equal(loaded["model"]["weight"], model.weight),
              "backward": torch.Tensor.backward.__name__, "doc": (torch.Tensor.backward.__doc__ or "")[:40]}
    print("result " + json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":  # spawned DataLoader workers import this file again
    main()
