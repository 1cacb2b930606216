"""How a traced block's outputs and inputs are laid out and named: nested outputs flattened to a
list of arrays and rebuilt, the structure the export manifest writes, the data inputs' names, and
the names of the tensors a graph captured. Shared by nn.block and kiln.sym, which import this
instead of each other.
"""

__all__ = []


def _flatten(out):
    """Flattens nested lists/tuples of NDArrays; returns the arrays and a structure to rebuild."""
    if isinstance(out, (list, tuple)):
        arrays, parts = [], []
        for o in out:
            a, st = _flatten(o)
            arrays.extend(a)
            parts.append(st)
        return arrays, (type(out), parts)
    return [out], None


def _unflatten(arrays, structure, pos=0):
    if structure is None:
        return arrays[pos], pos + 1
    kind, parts = structure
    items = []
    for st in parts:
        item, pos = _unflatten(arrays, st, pos)
        items.append(item)
    return kind(items), pos


def _structure_indices(structure, pos=0):
    """A _flatten structure as the export manifest writes it: an int for a single output, nested
    lists of output indices otherwise."""
    if structure is None:
        return pos, pos + 1
    items = []
    for st in structure[1]:
        item, pos = _structure_indices(st, pos)
        items.append(item)
    return items, pos


def _data_input_names(n):
    """The graph's names for `n` data inputs: 'data' for one, 'data0', 'data1'... for several."""
    return ["data"] if n == 1 else [f"data{i}" for i in range(n)]


def _captured_names(captured, params):
    """Names for a graph's captured tensors: the structural name of the parameter whose data (on
    any device) each one is, else 'const0', 'const1'... (a constant the trace read)."""
    names, used, k = [], set(), 0
    for c in captured:
        name = None
        for pname, param in params.items():
            if param._data is not None and any(
                    c is a or (c.shape == a.shape and c._shares_storage(a)) for a in param._data):
                name = pname
                break
        if name is None or name in used:
            while f"const{k}" in used or f"const{k}" in params:
                k += 1
            name = f"const{k}"
        used.add(name)
        names.append(name)
    return names


def _param_order(names, params):
    """The order export writes a graph's captured tensors named `names` in: the parameters in
    `params`' (collect_params) order, then the rest ('const0', ...) as the trace read them; so
    that a Symbol's list_arguments() and the file list parameters alike, traced or not. Returns
    indices into `names`."""
    rank = {k: i for i, k in enumerate(params)}
    return sorted(range(len(names)), key=lambda i: (rank.get(names[i], len(rank)), i))
