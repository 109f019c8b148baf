"""CUDA_VISIBLE_DEVICES as CUDA reads it, and `--include host:0,2` mapped through the value a node already has
(stdlib only, Python 3.8+, no imports: the agent's start reads it before torchrun's; launcher/node/common/gpus.py
matches the entries to nvidia-smi's GPUs)."""

VISIBLE = "CUDA_VISIBLE_DEVICES"


def entries(spec):
    """CUDA_VISIBLE_DEVICES as CUDA reads it: its entries up to the first invalid one (`0,2,-1,1` shows 0 and 2)."""
    found = []
    for word in (w.strip() for w in spec.split(",")):
        if not word or word.startswith("-") or not (word.isdigit() or word.startswith(("GPU-", "MIG-"))):
            break
        found.append(word)
    return found


def chosen(inherited, indices):
    """CUDA_VISIBLE_DEVICES for a run that `--include host:0,2` gave GPUs `indices`: the node's own value at those
    places where its login or setup sets one (a site's allocation, a shared node's share), else the indices.
    (value, None), or (None, why) when the node shows fewer GPUs than asked for."""
    if indices is None:
        return inherited, None
    if inherited is None:
        return ",".join(str(i) for i in indices), None
    shown = entries(inherited)
    missing = [i for i in indices if i >= len(shown)]
    if missing:
        return None, "GPU %s chosen (--include/--exclude), but this node's own %s=%s shows %d GPU(s)" % (
            ",".join(str(i) for i in missing),
            VISIBLE,
            inherited,
            len(shown),
        )
    return ",".join(shown[i] for i in indices), None
