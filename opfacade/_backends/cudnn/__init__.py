"""cuDNN v9 fused attention graphs through nvidia-cudnn-frontend (cudnn.pygraph).

    limits.py   what the SDPA graphs serve, as data (head dims, dtypes, arch and version gates,
                and the sizes they index: int64 tensors, a workspace below 2**48)
    runtime.py  the library: lazy import, backend version, handles per (thread, device)
    graphs.py   tensor UIDs, building in the fixed order, the graph cache, executing by UID
    selection.py  how every graph SKU is selected: data limits, then the built graph's verdict
    sdpa.py     the SKUs: forward per element, default and deterministic backward per element
    ragged.py   varlen_attention's ragged (THD) graphs, declared for a bucket
    varlen.py   varlen_attention's SKUs over them
"""


def clear_caches() -> None:
    """Drops every built graph, every cached "not supported" verdict and what the SKUs derived
    from them. Handles stay: see ``runtime.py``."""
    from . import sdpa
    from .graphs import GRAPHS

    GRAPHS.clear()
    sdpa.clear()
