"""Data sets, client partitions and TFF client data for tff_pfl.

*   `sources`: loaders returning an in-memory `ArrayDataset`.
*   `registry`: named data sets (`load_dataset`, `list_datasets`).
*   `partition`: seeded IID/Dirichlet/Disjoint/shard partitions and the
    serialisable `Partition`.
*   `client_data`: `tff.simulation.datasets.ClientData` and batching with
    seedable augmentation. Imported lazily because it imports TFF.
"""

from tff_pfl.data.partition import ClientSplit
from tff_pfl.data.partition import make_partition
from tff_pfl.data.partition import Partition
from tff_pfl.data.registry import list_datasets
from tff_pfl.data.registry import load_dataset
from tff_pfl.data.sources import ArrayDataset
